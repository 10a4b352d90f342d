//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

// TestHelmUpgradeWithoutAGap checks that `helm upgrade` never leaves the
// node unable to prepare claims (issue 22): the chart's plugin DaemonSet
// rolls with maxSurge 1, also with hostNetwork and a metrics port (both
// pods serve the node's port, SO_REUSEPORT), and the new pod turns Ready
// only once the kubelet registered it. While the upgrade rolls the plugin,
// a stream of pods with one-GPU claims starts on the real node, each
// deleted once it runs so that GPUs free up. Then:
//   - every pod of the stream ran (its claim was prepared) and no pod got
//     a FailedPrepareDynamicResources event;
//   - the two plugin pods overlapped: the DaemonSet deleted the old pod
//     only after the new one was Ready (in the order of the watch events,
//     that is of the API server's resource versions), and the new one
//     had registered with the kubelet;
//   - no claim was prepared twice: each stream claim's UID is in exactly
//     one "Prepared claim" line of the two plugins' logs together (the
//     plugin logs it at -v=2 for every claim a call prepared, not for one
//     it finds prepared already).
func TestHelmUpgradeWithoutAGap(t *testing.T) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	cc := startChartCluster(ctx, t, "glupgrade", "cluster logs in c/logs, pod logs in c/pod-logs",
		localcluster.Options{}, map[string]string{"helm": "build helm first (make helm)"})
	root, dir, cluster := cc.root, cc.dir, cc.cluster
	helm := filepath.Join(cc.binDir, "helm")
	client := cluster.Client()
	node := cluster.NodeName()
	s := &suite{cluster: cluster, client: client, realNode: node, mpsRoot: filepath.Join(dir, "mps")}
	driverRoot, _ := s.prepareChartNode(ctx, t, filepath.Join(root, "driver", "topology", "testdata", "pcie-nvbridge-8.txt"), dir)
	t.Logf("cluster up and image imported %.1fs after the start", time.Since(begin).Seconds())

	// As TestHelmInstallOnRealNode, without the API-only node and the
	// webhook; one controller replica. The plugin keeps its metrics port
	// on the node's network: the case that used to roll without a surge.
	values := s.chartValues(t, dir, driverRoot, fmt.Sprintf(`controller:
  replicas: 1
  nodeSelector: {kubernetes.io/hostname: %s}
compat:
  enabled: false
`, node))
	runHelm := func(args ...string) {
		t.Helper()
		args = append(args, "--kubeconfig", cluster.Kubeconfig(), "--namespace", chartNamespace)
		if out, err := exec.CommandContext(ctx, helm, args...).CombinedOutput(); err != nil {
			t.Fatalf("helm %v: %v\n%s", args, err, out)
		}
	}
	chart := filepath.Join(root, "deployments", "helm", "gpulink")
	runHelm(append([]string{"install", helmRelease, chart}, values...)...)
	old := waitComponentPod(ctx, t, client, "kubelet-plugin", "")
	waitSlices(ctx, t, client, node, 8)
	if err := waitGatePolicy(ctx, client, ns); err != nil {
		t.Fatal(err)
	}
	s.template(ctx, t, "one-gpu", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 1}, nil)
	t.Logf("chart installed, plugin pod %s ready %.1fs after the start", old.Name, time.Since(begin).Seconds())

	pw := watchPluginPods(ctx, t, client)
	oldLog := followLog(ctx, client, old)
	stream := startPodStream(ctx, s, "one-gpu")
	// Pods already flowing before the upgrade starts.
	time.Sleep(3 * time.Second)
	upgradeStart := time.Now()
	runHelm(append([]string{"upgrade", helmRelease, chart, "--set-string", "kubeletPlugin.podAnnotations.rollout=2"}, values...)...)
	newPod := waitRollout(ctx, t, client, old)
	rolled := time.Now()
	t.Logf("rollout done %.1fs after helm upgrade started: %s replaced by %s", rolled.Sub(upgradeStart).Seconds(), old.Name, newPod.Name)
	// And some more pods on the new plugin alone.
	time.Sleep(5 * time.Second)
	pods := stream.stop(ctx, t)
	// The plugin pods' logs: the old one's to its end, followed from
	// before the upgrade (its log file goes with the pod).
	var logs [2]string
	select {
	case logs[0] = <-oldLog:
	case <-ctx.Done():
		t.Fatalf("old plugin pod %s's log did not end: %v", old.Name, ctx.Err())
	}
	raw, err := client.CoreV1().Pods(chartNamespace).GetLogs(newPod.Name, &corev1.PodLogOptions{Container: "plugin"}).DoRaw(ctx)
	if err != nil {
		t.Fatalf("log of plugin pod %s: %v", newPod.Name, err)
	}
	logs[1] = string(raw)

	t.Run("every pod of the stream ran, none failed to prepare", func(t *testing.T) {
		var during int
		for _, p := range pods {
			if !p.running {
				t.Errorf("pod %s never ran: %s", p.name, p.state)
			}
			if !p.created.Before(upgradeStart) && p.created.Before(rolled) {
				during++
			}
		}
		t.Logf("%d pods ran, %d of them created between helm upgrade and the end of the rollout", len(pods), during)
		if during == 0 {
			t.Error("no pod was created during the rollout: the stream did not cover it")
		}
		events, err := client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "reason=FailedPrepareDynamicResources"})
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range events.Items {
			t.Errorf("pod %s: %s: %s", e.InvolvedObject.Name, e.Reason, e.Message)
		}
	})
	t.Run("the old plugin pod was deleted only after the new one registered and was ready", func(t *testing.T) {
		// Ready only once registered: the log's clock is the test's (one
		// machine), its lines say when.
		registered, err := registeredAt(logs[1], time.Now())
		if err != nil {
			t.Errorf("new plugin pod %s: %v", newPod.Name, err)
		} else if ready := pw.at(newPod.UID, "ready"); !ready.After(registered) {
			t.Errorf("new plugin pod %s was ready at %s, before it registered with the kubelet at %s", newPod.Name, ready.Format(time.StampMicro), registered.Format(time.StampMicro))
		} else {
			t.Logf("new plugin pod %s registered with the kubelet %.2fs before the watch saw it ready", newPod.Name, ready.Sub(registered).Seconds())
		}
		ready, deleting := pw.order(newPod.UID, old.UID)
		if ready < 0 || deleting < 0 {
			t.Fatalf("watch saw new pod %s ready at event %d, old pod %s deleted at event %d", newPod.Name, ready, old.Name, deleting)
		}
		if ready > deleting {
			t.Errorf("old pod %s deleted (watch event %d) before new pod %s was ready (event %d)", old.Name, deleting, newPod.Name, ready)
		}
		t.Logf("both plugin pods ran for %.1fs: %s created at +%.1fs, ready at +%.1fs, %s deleted at +%.1fs, gone at +%.1fs (seconds after helm upgrade started)",
			pw.at(old.UID, "gone").Sub(pw.at(newPod.UID, "seen")).Seconds(), newPod.Name,
			pw.at(newPod.UID, "seen").Sub(upgradeStart).Seconds(), pw.at(newPod.UID, "ready").Sub(upgradeStart).Seconds(),
			old.Name, pw.at(old.UID, "deleting").Sub(upgradeStart).Seconds(), pw.at(old.UID, "gone").Sub(upgradeStart).Seconds())
	})
	t.Run("no claim was prepared twice", func(t *testing.T) {
		prepared := map[string][]int{}
		for i, l := range logs {
			for _, m := range preparedClaimRE.FindAllStringSubmatch(l, -1) {
				prepared[m[1]] = append(prepared[m[1]], i)
			}
		}
		var byOld, byNew int
		for _, p := range pods {
			if !p.running {
				continue // reported above
			}
			switch by := prepared[string(p.claimUID)]; {
			case len(by) != 1:
				t.Errorf("claim %s (pod %s) prepared %d times (0: old plugin, 1: new one: %v)", p.claimUID, p.name, len(by), by)
			case by[0] == 0:
				byOld++
			default:
				byNew++
			}
		}
		t.Logf("the old plugin pod prepared %d claims of the stream, the new one %d", byOld, byNew)
		if byOld == 0 || byNew == 0 {
			t.Errorf("the stream's claims were not prepared by both plugin pods (old %d, new %d)", byOld, byNew)
		}
	})
	t.Logf("upgrade e2e took %.1fs", time.Since(begin).Seconds())
}

// preparedClaimRE matches the plugin's log line for a claim a
// NodePrepareResources call prepared (kubeletplugin/prepare.go).
var preparedClaimRE = regexp.MustCompile(`"Prepared claim".* uid="([^"]+)"`)

// registeredRE matches the plugin's klog line for its registration with
// the kubelet (kubeletplugin/registration.go): month, day and time.
var registeredRE = regexp.MustCompile(`(?m)^I(\d{4} \d{2}:\d{2}:\d{2}\.\d{6}) .*"Registered with the kubelet"`)

// registeredAt is when the plugin's log says it registered; the klog
// header has no year (now's) and the container's clock is UTC.
func registeredAt(log string, now time.Time) (time.Time, error) {
	m := registeredRE.FindStringSubmatch(log)
	if m == nil {
		return time.Time{}, fmt.Errorf("no registration in the log:\n%s", log)
	}
	at, err := time.ParseInLocation("0102 15:04:05.000000", m[1], time.UTC)
	if err != nil {
		return time.Time{}, fmt.Errorf("registration time %q: %w", m[1], err)
	}
	return at.AddDate(now.UTC().Year(), 0, 0), nil
}

// waitRollout waits until the DaemonSet has replaced old by a new ready
// pod and old is gone, and returns the new pod.
func waitRollout(ctx context.Context, t *testing.T, client kubernetes.Interface, old *corev1.Pod) *corev1.Pod {
	t.Helper()
	newPod := waitComponentPod(ctx, t, client, "kubelet-plugin", old.UID)
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		_, err := client.CoreV1().Pods(chartNamespace).Get(ctx, old.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		return false, err
	})
	if err != nil {
		t.Fatalf("old plugin pod %s not gone: %v", old.Name, err)
	}
	return newPod
}

// pluginPodWatch records the plugin pods' changes in the order of the
// API server's watch events.
type pluginPodWatch struct {
	mu     sync.Mutex
	events []podEvent
}

type podEvent struct {
	uid types.UID
	// what: "seen", "ready", "deleting" or "gone"
	what string
	at   time.Time
}

// watchPluginPods records, for every plugin pod, when the watch first saw
// it, saw it ready, saw its deletion start and saw it gone.
func watchPluginPods(ctx context.Context, t *testing.T, client kubernetes.Interface) *pluginPodWatch {
	t.Helper()
	w, err := client.CoreV1().Pods(chartNamespace).Watch(ctx, metav1.ListOptions{LabelSelector: "app.kubernetes.io/component=kubelet-plugin"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	pw := &pluginPodWatch{}
	go func() {
		seen := map[string]bool{}
		for ev := range w.ResultChan() {
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			note := func(what string) {
				if key := string(p.UID) + what; !seen[key] {
					seen[key] = true
					pw.mu.Lock()
					pw.events = append(pw.events, podEvent{uid: p.UID, what: what, at: time.Now()})
					pw.mu.Unlock()
				}
			}
			note("seen")
			if podReady(p) {
				note("ready")
			}
			if p.DeletionTimestamp != nil {
				note("deleting")
			}
			if ev.Type == "DELETED" {
				note("gone")
			}
		}
	}()
	return pw
}

// order returns the indexes of the events that saw ready ready and
// deleting deleted; -1 when not seen.
func (pw *pluginPodWatch) order(ready, deleted types.UID) (int, int) {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	r, d := -1, -1
	for i, e := range pw.events {
		if e.uid == ready && e.what == "ready" && r < 0 {
			r = i
		}
		if e.uid == deleted && e.what == "deleting" && d < 0 {
			d = i
		}
	}
	return r, d
}

// at is when the watch saw what of pod uid; the zero time if it did not.
func (pw *pluginPodWatch) at(uid types.UID, what string) time.Time {
	pw.mu.Lock()
	defer pw.mu.Unlock()
	for _, e := range pw.events {
		if e.uid == uid && e.what == what {
			return e.at
		}
	}
	return time.Time{}
}

// followLog follows the plugin container's log of pod until it exits and
// sends all of it (or the error) on the channel.
func followLog(ctx context.Context, client kubernetes.Interface, pod *corev1.Pod) <-chan string {
	ch := make(chan string, 1)
	go func() {
		r, err := client.CoreV1().Pods(pod.Namespace).GetLogs(pod.Name, &corev1.PodLogOptions{Container: "plugin", Follow: true}).Stream(ctx)
		if err != nil {
			ch <- fmt.Sprintf("following the log of %s: %v", pod.Name, err)
			return
		}
		defer func() { _ = r.Close() }()
		data, err := io.ReadAll(r)
		if err != nil {
			data = fmt.Appendf(data, "\nreading the log of %s: %v", pod.Name, err)
		}
		ch <- string(data)
	}()
	return ch
}

// streamPod is one pod of the stream.
type streamPod struct {
	name     string
	created  time.Time
	running  bool
	claimUID types.UID
	state    string
}

// podStream starts a pod with a claim from a template every streamEvery
// on the real node and deletes each once it runs, so that its GPU frees
// up; at most streamMax pods are undeleted at a time.
type podStream struct {
	s        *suite
	template string
	quit     chan struct{}
	done     chan struct{}
	mu       sync.Mutex
	pods     []*streamPod
	errs     []error
}

const (
	streamEvery = 400 * time.Millisecond
	// streamMax leaves one of the node's 8 GPUs to pods being deleted.
	streamMax = 7
)

func startPodStream(ctx context.Context, s *suite, template string) *podStream {
	ps := &podStream{s: s, template: template, quit: make(chan struct{}), done: make(chan struct{})}
	go ps.run(ctx)
	return ps
}

func (ps *podStream) run(ctx context.Context) {
	defer close(ps.done)
	tick := time.NewTicker(streamEvery)
	defer tick.Stop()
	creating := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-ps.quit:
			creating = false
		case <-tick.C:
		}
		pending := ps.check(ctx)
		if !creating {
			if pending == 0 {
				return
			}
			continue
		}
		if pending < streamMax {
			ps.create(ctx)
		}
	}
}

// create starts the next pod of the stream.
func (ps *podStream) create(ctx context.Context) {
	ps.mu.Lock()
	name := fmt.Sprintf("stream-%03d", len(ps.pods))
	ps.mu.Unlock()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "gpulink-upgrade"}},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{corev1.LabelHostname: ps.s.realNode},
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &ps.template}},
			Containers: []corev1.Container{{
				Name:            "workload",
				Image:           localcluster.WorkloadImage,
				ImagePullPolicy: corev1.PullNever,
				Resources:       corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
				Env:             ps.s.workloadEnv,
			}},
		},
	}
	created := time.Now()
	if _, err := ps.s.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		ps.fail(fmt.Errorf("creating pod %s: %w", name, err))
		return
	}
	ps.mu.Lock()
	ps.pods = append(ps.pods, &streamPod{name: name, created: created, state: "created"})
	ps.mu.Unlock()
}

// check notes which pods run, deletes them, and returns how many pods
// have not run yet.
func (ps *podStream) check(ctx context.Context) int {
	list, err := ps.s.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: "app=gpulink-upgrade"})
	if err != nil {
		ps.fail(err)
		return 0
	}
	byName := map[string]*corev1.Pod{}
	for i := range list.Items {
		byName[list.Items[i].Name] = &list.Items[i]
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	pending := 0
	for _, sp := range ps.pods {
		if sp.running {
			continue
		}
		p := byName[sp.name]
		if p == nil {
			sp.state = "gone before it ran"
			continue
		}
		if p.Status.Phase != corev1.PodRunning {
			pending++
			sp.state = fmt.Sprintf("phase %s, gates %v", p.Status.Phase, p.Spec.SchedulingGates)
			continue
		}
		// Running: the kubelet prepared the claim before starting the
		// container. Its UID, then the pod goes and frees the GPU.
		if len(p.Status.ResourceClaimStatuses) == 0 || p.Status.ResourceClaimStatuses[0].ResourceClaimName == nil {
			ps.errs = append(ps.errs, fmt.Errorf("pod %s runs without a claim status", sp.name))
			continue
		}
		claim, err := ps.s.client.ResourceV1().ResourceClaims(ns).Get(ctx, *p.Status.ResourceClaimStatuses[0].ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			ps.errs = append(ps.errs, fmt.Errorf("claim of pod %s: %w", sp.name, err))
			continue
		}
		sp.running, sp.claimUID, sp.state = true, claim.UID, "ran"
		if err := ps.s.client.CoreV1().Pods(ns).Delete(ctx, sp.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			ps.errs = append(ps.errs, fmt.Errorf("deleting pod %s: %w", sp.name, err))
		}
	}
	return pending
}

func (ps *podStream) fail(err error) {
	ps.mu.Lock()
	ps.errs = append(ps.errs, err)
	ps.mu.Unlock()
}

// stop ends the stream, waits until every pod started ran (or a minute
// passed) and returns the pods in the order they were created.
func (ps *podStream) stop(ctx context.Context, t *testing.T) []streamPod {
	t.Helper()
	close(ps.quit)
	select {
	case <-ps.done:
	case <-time.After(time.Minute):
		t.Error("pods of the stream still not running a minute after it stopped")
	case <-ctx.Done():
	}
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for _, err := range ps.errs {
		t.Error(err)
	}
	out := make([]streamPod, 0, len(ps.pods))
	for _, p := range ps.pods {
		out = append(out, *p)
	}
	return out
}
