package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

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
