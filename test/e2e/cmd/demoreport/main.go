// Command demoreport is the Go half of `make demo` (hack/demo.sh): it waits
// for what the demo deployed and explains the result.
//
//	demoreport wait-slices -node NAME -devices N      until the node's gpulink pool has N devices
//	demoreport wait -pods a,b [-real-node NAME]       until each pod's claims are allocated, its
//	                                                  scheduling gate is gone and it is bound (and
//	                                                  Running when bound to the real node)
//	demoreport report -pods a,b [-real-node NAME]     print a table: pod, node, GPUs, weakest link,
//	                                                  share limits, and what first fit would have given
//	demoreport wait-gate                              until the chart's policy gives a pod with a claim
//	                                                  gpulink's scheduling gate (a server-side dry run)
//	demoreport driver-root -dir DIR -gpus N           lay out the stand-in driver install of the real
//	                                                  node under DIR, as the e2e tests do
//	                                                  (localcluster.WriteFakeDriverFiles, MakeDeviceNodes)
//
// Common flags: -kubeconfig, -namespace, -run-dir (a directory of NAME.pid
// and NAME.log files of the gpulink processes; waiting fails with the log's
// tail as soon as one of them has exited), -timeout. driver-root takes
// only its own and needs no cluster.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

type options struct {
	kubeconfig, namespace, runDir, realNode, node, podLogDir string
	pods                                                     []string
	devices, gpus                                            int
	driverRoot                                               string
	timeout                                                  time.Duration
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: demoreport wait-slices|wait|report|wait-gate|driver-root [flags]")
		os.Exit(2)
	}
	cmd := os.Args[1]
	fs := flag.NewFlagSet("demoreport "+cmd, flag.ExitOnError)
	var o options
	var pods string
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the cluster")
	fs.StringVar(&o.namespace, "namespace", "gpulink-demo", "namespace of the demo pods")
	fs.StringVar(&o.runDir, "run-dir", "", "directory of the gpulink processes' NAME.pid and NAME.log files")
	fs.StringVar(&o.realNode, "real-node", "local-node", "the node with a kubelet; pods bound to it must run")
	fs.StringVar(&o.node, "node", "", "wait-slices: the node")
	fs.IntVar(&o.devices, "devices", 0, "wait-slices: number of devices to wait for")
	fs.StringVar(&pods, "pods", "", "comma-separated pod names, in the order they were created")
	fs.StringVar(&o.podLogDir, "pod-log-dir", "", "the kubelet's pod log directory, read when the API cannot fetch a log")
	fs.DurationVar(&o.timeout, "timeout", 4*time.Minute, "how long to wait")
	fs.StringVar(&o.driverRoot, "dir", "", "driver-root: the directory to lay the driver install out in")
	fs.IntVar(&o.gpus, "gpus", 0, "driver-root: number of GPUs (/dev/nvidiaN stand-ins)")
	_ = fs.Parse(os.Args[2:])
	if pods != "" {
		o.pods = strings.Split(pods, ",")
	}
	if cmd == "driver-root" {
		if err := driverRoot(o); err != nil {
			fatal(err)
		}
		return
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		fatal(fmt.Errorf("kubeconfig %q: %w", o.kubeconfig, err))
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), o.timeout+30*time.Second)
	defer cancel()
	switch cmd {
	case "wait-slices":
		err = waitSlices(ctx, client, o)
	case "wait":
		err = waitPods(ctx, client, o)
	case "report":
		err = report(ctx, client, o)
	case "wait-gate":
		err = waitGate(ctx, client, o)
	default:
		err = fmt.Errorf("unknown command %q (want wait-slices, wait, report, wait-gate or driver-root)", cmd)
	}
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "demoreport: error: %v\n", err)
	os.Exit(1)
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "[demo %s] %s\n", time.Now().UTC().Format("15:04:05"), fmt.Sprintf(format, args...))
}

// processesAlive returns an error naming the first gpulink process of the
// run directory that is no longer running, with the tail of its log.
func processesAlive(runDir string) error {
	if runDir == "" {
		return nil
	}
	pidFiles, err := filepath.Glob(filepath.Join(runDir, "*.pid"))
	if err != nil {
		return err
	}
	for _, f := range pidFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if syscall.Kill(pid, 0) != nil {
			log := strings.TrimSuffix(f, ".pid") + ".log"
			return fmt.Errorf("%s (pid %d) is not running; last lines of %s:\n%s", filepath.Base(strings.TrimSuffix(f, ".pid")), pid, log, localcluster.TailFile(log, 20))
		}
	}
	return nil
}

// driverRoot lays out the stand-in driver install the real node's kubelet
// plugin reads (nvcdi finds the driver's files; containers get the
// /dev/nvidia* stand-ins through CDI), the layout the e2e tests use.
func driverRoot(o options) error {
	if o.driverRoot == "" || o.gpus <= 0 {
		return fmt.Errorf("driver-root needs -dir and -gpus > 0, got -dir %q -gpus %d", o.driverRoot, o.gpus)
	}
	if _, err := localcluster.WriteFakeDriverFiles(o.driverRoot); err != nil {
		return fmt.Errorf("driver files under %s: %w", o.driverRoot, err)
	}
	if err := localcluster.MakeDeviceNodes(o.driverRoot, o.gpus); err != nil {
		if !errors.Is(err, syscall.EPERM) {
			return fmt.Errorf("device nodes under %s: %w", o.driverRoot, err)
		}
		progress("mknod not permitted (%v): containers get the GPU environment but no /dev/nvidia* stand-ins", err)
	}
	return nil
}

// waitGate waits until the API server applies the chart's scheduling-gate
// policy, which it picks up asynchronously: a server-side dry run of a pod
// with a claim is repeated until it comes back with gpulink's gate. The
// pod is in namespace default, which exists before the demo's own.
func waitGate(ctx context.Context, client kubernetes.Interface, o options) error {
	template := "gate-probe"
	probe := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gate-probe", Namespace: metav1.NamespaceDefault},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &template}},
			Containers: []corev1.Container{{Name: "probe", Image: localcluster.WorkloadImage,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}}}},
		},
	}
	var gates []string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, o.timeout, true, func(ctx context.Context) (bool, error) {
		p, err := client.CoreV1().Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			return false, nil // the policy's API objects may not be served yet
		}
		gates = gates[:0]
		for _, g := range p.Spec.SchedulingGates {
			gates = append(gates, g.Name)
		}
		return slices.Equal(gates, []string{driver.SchedulingGate}), nil
	})
	if err != nil {
		return fmt.Errorf("the scheduling-gate policy did not take effect within %s (a dry-run pod got gates %q, want %q): %w", o.timeout, gates, driver.SchedulingGate, err)
	}
	progress("the scheduling-gate policy is in effect")
	return nil
}

func waitSlices(ctx context.Context, client kubernetes.Interface, o options) error {
	if o.node == "" || o.devices <= 0 {
		return errors.New("wait-slices needs -node and -devices")
	}
	start := time.Now()
	have := 0
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, o.timeout, true, func(ctx context.Context) (bool, error) {
		if err := processesAlive(o.runDir); err != nil {
			return false, err
		}
		nodes, err := gpuview.Nodes(ctx, client)
		if err != nil {
			return false, nil // a pool may be half-published
		}
		have = 0
		if n := nodes[o.node]; n != nil {
			have = len(n.GPUs)
		}
		return have == o.devices, nil
	})
	if err != nil {
		return fmt.Errorf("node %s: %d of %d GPUs published: %w", o.node, have, o.devices, err)
	}
	progress("%s: %d GPUs published as ResourceSlices (%.1fs)", o.node, o.devices, time.Since(start).Seconds())
	return nil
}

// podClaims returns the pod's claims, nil while one is not created yet.
func podClaims(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) ([]*resourceapi.ResourceClaim, error) {
	var out []*resourceapi.ResourceClaim
	for _, pc := range pod.Spec.ResourceClaims {
		name := pc.ResourceClaimName
		if name == nil {
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name {
					name = st.ResourceClaimName
				}
			}
		}
		if name == nil {
			return nil, nil
		}
		c, err := client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, *name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

func waitPods(ctx context.Context, client kubernetes.Interface, o options) error {
	if len(o.pods) == 0 {
		return errors.New("wait needs -pods")
	}
	for _, name := range o.pods {
		start := time.Now()
		state := "not created"
		var pod *corev1.Pod
		err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, o.timeout, true, func(ctx context.Context) (bool, error) {
			if err := processesAlive(o.runDir); err != nil {
				return false, err
			}
			var err error
			pod, err = client.CoreV1().Pods(o.namespace).Get(ctx, name, metav1.GetOptions{})
			if err != nil {
				return false, err
			}
			claims, err := podClaims(ctx, client, pod)
			if err != nil {
				return false, err
			}
			if claims == nil {
				state = "waiting for its ResourceClaim"
				return false, nil
			}
			for _, c := range claims {
				if c.Status.Allocation == nil {
					state = "claim " + c.Name + " not allocated"
					return false, nil
				}
			}
			switch {
			case slices.ContainsFunc(pod.Spec.SchedulingGates, func(g corev1.PodSchedulingGate) bool { return g.Name == driver.SchedulingGate }):
				state = "allocated, scheduling gate not removed yet"
			case pod.Spec.NodeName == "":
				state = "allocated and ungated, not bound yet"
			case pod.Spec.NodeName == o.realNode && !podReady(pod):
				state = "bound to " + pod.Spec.NodeName + ", not running yet"
			default:
				return true, nil
			}
			return false, nil
		})
		if err != nil {
			return fmt.Errorf("pod %s/%s: %s after %.0fs: %w%s", o.namespace, name, state, time.Since(start).Seconds(), err, podEvents(context.Background(), client, o.namespace, name))
		}
		what := "running"
		if pod.Spec.NodeName != o.realNode {
			what = "bound (API-only node: nothing runs there)"
		}
		progress("pod %s: allocated, ungated, %s on %s (%.1fs)", name, what, pod.Spec.NodeName, time.Since(start).Seconds())
	}
	return nil
}

func podReady(pod *corev1.Pod) bool {
	if pod.Status.Phase != corev1.PodRunning {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func podEvents(ctx context.Context, client kubernetes.Interface, ns, name string) string {
	events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + name})
	if err != nil || len(events.Items) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("\nevents:")
	for _, e := range events.Items {
		fmt.Fprintf(&b, "\n  %s %s: %s", e.Type, e.Reason, e.Message)
	}
	return b.String()
}

// usage is what claims hold on one node, replayed in allocation order.
type usage struct {
	whole         map[string]bool
	memory, cores map[string]int64
}

func (u *usage) add(h gpuview.Holding) {
	shared := map[string]bool{}
	for _, r := range h.Shares {
		shared[r.Device] = true
		u.memory[r.Device] += gpuview.Consumed(r, driver.CapacityMemory)
		u.cores[r.Device] += gpuview.Consumed(r, driver.CapacityCores)
	}
	for _, d := range h.Devices {
		if !shared[d] {
			u.whole[d] = true
		}
	}
}

type row struct {
	pod, node, status, gpus, weakest, share, firstFit, firstFitLink string
}

func report(ctx context.Context, client kubernetes.Interface, o options) error {
	if len(o.pods) == 0 {
		return errors.New("report needs -pods")
	}
	nodes, err := gpuview.Nodes(ctx, client)
	if err != nil {
		return err
	}
	all, err := client.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	// Claims of other pods count as used from the start; the demo's pods
	// are replayed in the order they were created (each was allocated
	// before the next was created).
	demoClaims := map[string]bool{}
	type podInfo struct {
		pod      *corev1.Pod
		holdings []gpuview.Holding
	}
	var infos []podInfo
	for _, name := range o.pods {
		pod, err := client.CoreV1().Pods(o.namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		claims, err := podClaims(ctx, client, pod)
		if err != nil {
			return err
		}
		info := podInfo{pod: pod}
		for _, c := range claims {
			demoClaims[string(c.UID)] = true
			h, _, err := gpuview.ClaimDevices(c)
			if err != nil {
				return err
			}
			info.holdings = append(info.holdings, h)
		}
		infos = append(infos, info)
	}
	used := map[string]*usage{}
	for name := range nodes {
		used[name] = &usage{whole: map[string]bool{}, memory: map[string]int64{}, cores: map[string]int64{}}
	}
	for i := range all.Items {
		if demoClaims[string(all.Items[i].UID)] {
			continue
		}
		if h, ok, err := gpuview.ClaimDevices(&all.Items[i]); err == nil && ok && used[h.Node] != nil {
			used[h.Node].add(h)
		}
	}

	var rows []row
	for _, info := range infos {
		r := row{pod: info.pod.Name, node: info.pod.Spec.NodeName, status: string(info.pod.Status.Phase),
			gpus: "-", weakest: "-", share: "-", firstFit: "-", firstFitLink: "-"}
		if r.node == "" {
			r.node = "(unbound)"
		} else if r.node != o.realNode {
			r.status = "Bound (API-only)"
		}
		for _, h := range info.holdings {
			node := nodes[h.Node]
			u := used[h.Node]
			if node == nil || u == nil || len(h.Devices) == 0 {
				continue
			}
			r.gpus = gpuview.Indexes(h.Devices)
			if len(h.Shares) > 0 {
				sh := h.Shares[0]
				mem, cores := gpuview.Consumed(sh, driver.CapacityMemory), gpuview.Consumed(sh, driver.CapacityCores)
				r.share = fmt.Sprintf("%s, %d%% SMs", resource.NewQuantity(mem, resource.BinarySI).String(), cores)
				if limits := mpsLimits(ctx, client, o, info.pod); limits != "" {
					r.share += "; MPS " + limits
				}
				r.firstFit = firstFitShare(node, u, mem, cores)
			} else {
				if w, err := node.Weakest(h.Devices); err == nil && w != topology.LinkNone {
					r.weakest = w.String()
				}
				free := map[string]bool{}
				for _, g := range node.GPUs {
					free[g.Device] = !u.whole[g.Device] && u.memory[g.Device] == 0 && u.cores[g.Device] == 0
				}
				if ff := node.FirstFit(len(h.Devices), free); ff != nil {
					r.firstFit = gpuview.Indexes(ff)
					if w, err := node.Weakest(ff); err == nil && w != topology.LinkNone {
						r.firstFitLink = w.String()
					}
				} else {
					r.firstFit = "(no fit)"
				}
			}
			u.add(h)
		}
		rows = append(rows, r)
	}

	fmt.Println()
	fmt.Println("GPU nodes (topologies from demo/topologies, published by one gpulink-kubeletplugin each; the controller: the chart's Deployment):")
	names := make([]string, 0, len(nodes))
	for n := range nodes {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		kind := "API-only node, pods are bound but never run; plugin: a process (no kubelet to run the DaemonSet's pod)"
		if n == o.realNode {
			kind = "real node: kubelet + containerd, pods run; plugin: the chart's DaemonSet pod"
		}
		fmt.Printf("  %-12s %d x %-22s %s\n", n, len(nodes[n].GPUs), nodes[n].Product, kind)
	}
	fmt.Println()
	tw := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "POD\tNODE\tSTATUS\tGPUS\tWEAKEST LINK\tSHARE; LIMITS THE CONTAINER SEES\tFIRST FIT\tFIRST-FIT LINK")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.pod, r.node, r.status, r.gpus, r.weakest, r.share, r.firstFit, r.firstFitLink)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Println()
	fmt.Println("GPUS are nvidia-smi indexes on NODE. Links, best first: NV# (bonded NVLinks) > PIX > PXB > PHB > NODE > SYS.")
	fmt.Println("FIRST FIT is what an allocator that ignores links (kube-scheduler's) would have taken on the same node")
	fmt.Println("at that moment: the lowest free indexes (for a share, the lowest GPU with room).")
	return nil
}

func firstFitShare(node *gpuview.Node, u *usage, mem, cores int64) string {
	for _, g := range node.GPUs {
		if u.whole[g.Device] {
			continue
		}
		if u.memory[g.Device]+mem <= g.Memory && u.cores[g.Device]+cores <= g.Cores {
			return strings.TrimPrefix(g.Device, "gpu-")
		}
	}
	return "(no fit)"
}

// mpsLimits returns the MPS limits the workload container printed (its
// log holds "ENV k=v" lines), empty when the log cannot be read.
func mpsLimits(ctx context.Context, client kubernetes.Interface, o options, pod *corev1.Pod) string {
	log := ""
	if len(pod.Spec.Containers) == 0 {
		return ""
	}
	container := pod.Spec.Containers[0].Name
	raw, err := client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: container}).DoRaw(ctx)
	if err == nil {
		log = string(raw)
	} else if o.podLogDir != "" {
		log, _ = localcluster.ReadPodLogFile(o.podLogDir, pod, container)
	}
	// Shown as "mem 0=10240M, 30% threads".
	var mem, threads string
	for _, line := range strings.Split(log, "\n") {
		if v, ok := strings.CutPrefix(line, "ENV CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="); ok {
			mem = "mem " + v
		}
		if v, ok := strings.CutPrefix(line, "ENV CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="); ok {
			threads = v + "% threads"
		}
	}
	if mem == "" || threads == "" {
		return ""
	}
	return mem + ", " + threads
}
