//go:build integration

package controller_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/localcluster"
)

// env is one test's namespace and GPU nodes on the shared cluster.
type env struct {
	t      testing.TB
	ctx    context.Context
	client kubernetes.Interface
	ns     string
	topo   map[string]*topology.Topology // node -> topology
	// configure, when set, adjusts the configuration of the controllers
	// the test starts.
	configure func(*controller.Config)
}

func fixture(t testing.TB, name string) *topology.Topology {
	t.Helper()
	topo, err := topology.ParseFile("../../../driver/topology/testdata/" + name)
	if err != nil {
		t.Fatalf("fixture %s: %v", name, err)
	}
	return topo
}

// fastClient is a client with limits high enough for throughput tests.
func fastClient(t testing.TB) kubernetes.Interface {
	cfg := cluster.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// setup creates a namespace and API-only GPU nodes (node name -> fixture
// file) with their ResourceSlices, plus gpulink's DeviceClasses.
func setup(t testing.TB, nodes map[string]string) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &env{t: t, ctx: ctx, client: fastClient(t), ns: fmt.Sprintf("t-%d", rand.IntN(1_000_000)), topo: map[string]*topology.Topology{}}
	for _, c := range planner.DeviceClasses() {
		if _, err := e.client.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("service account "+e.ns+"/default", time.Minute, func() bool {
		_, err := e.client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	for name, file := range nodes {
		topo := fixture(t, file)
		e.topo[name] = topo
		e.addNode(name, topo)
	}
	t.Cleanup(e.teardown)
	return e
}

// addNode creates an API-only node and publishes its slice.
func (e *env) addNode(name string, topo *topology.Topology) {
	e.t.Helper()
	e.addNodeWith(name, topo, controllertest.Node(name))
}

// addNodeWith is addNode with a prepared Node object.
func (e *env) addNodeWith(name string, topo *topology.Topology, node *corev1.Node) {
	e.t.Helper()
	e.topo[name] = topo
	e.createNode(node)
	slice, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := e.client.ResourceV1().ResourceSlices().Create(e.ctx, slice, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *env) teardown() {
	ctx := context.Background()
	_ = e.client.CoreV1().Pods(e.ns).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}, metav1.ListOptions{})
	localcluster.DeleteClaims(ctx, e.client, e.ns)
	for name := range e.topo {
		_ = e.client.ResourceV1().ResourceSlices().Delete(ctx, name+"-gpu.gpulink.dev", metav1.DeleteOptions{})
		_ = e.client.CoreV1().Nodes().Delete(ctx, name, metav1.DeleteOptions{})
	}
	_ = e.client.CoreV1().Namespaces().Delete(ctx, e.ns, metav1.DeleteOptions{})
}

func (e *env) poll(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 20*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		e.t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// running is an in-process controller.
type running struct {
	cancel context.CancelFunc
	done   chan struct{}
	ctrl   *controller.Controller
}

// startController runs a controller in-process with its own client.
func (e *env) startController(workers int) *running {
	e.t.Helper()
	return e.startControllerWith(workers, nil)
}

// startControllerWith runs a controller whose client's transport is
// wrapped by wrap (nil: none), e.g. to inject API failures.
func (e *env) startControllerWith(workers int, wrap func(http.RoundTripper) http.RoundTripper) *running {
	e.t.Helper()
	ctx, cancel := context.WithCancel(e.ctx)
	logger := klog.Background().WithName("controller")
	ctx = klog.NewContext(ctx, logger)
	cfg := cluster.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	if wrap != nil {
		cfg.Wrap(wrap)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	rec, stopRec := controller.NewRecorder(ctx, client)
	ccfg := controller.Config{
		Client: client, Recorder: rec, Workers: workers,
		Policy:             allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack},
		UnschedulableGrace: 10 * time.Second,
		WaitingRetry:       5 * time.Second,
		DeviceTaintRules:   true,
		// Hold records of claims deleted under running pods go to the
		// test's namespace, which teardown empties.
		HoldNamespace: e.ns,
		// Pods are gangs through PodGroups where the cluster serves them
		// (GPULINK_WORKLOAD_GATES=off turns the Workload API off).
		Gangs: controller.GangConfig{PodGroups: cluster.WorkloadAPI()},
	}
	if e.configure != nil {
		e.configure(&ccfg)
	}
	ctrl, err := controller.New(ccfg)
	if err != nil {
		cancel()
		e.t.Fatal(err)
	}
	r := &running{cancel: cancel, done: make(chan struct{}), ctrl: ctrl}
	go func() {
		defer close(r.done)
		defer stopRec()
		// A restart may cancel the controller while Run still waits for
		// the caches that Ready already saw synced: not a failure.
		if err := ctrl.Run(ctx); err != nil && ctx.Err() == nil {
			e.t.Errorf("controller: %v", err)
		}
	}()
	e.poll("controller caches", time.Minute, ctrl.Ready)
	return r
}

func (r *running) stop() {
	r.cancel()
	<-r.done
}

// template creates a ResourceClaimTemplate.
func (e *env) template(name string, spec resourceapi.DeviceClaim) {
	e.t.Helper()
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: spec}}}
	if _, err := e.client.ResourceV1().ResourceClaimTemplates(e.ns).Create(e.ctx, tpl, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// newPod returns a pod using the templates, gated as the chart's admission
// policy would gate it when gated is set.
func (e *env) newPod(name string, gated bool, templates ...string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			Containers:                    []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
	for i, tpl := range templates {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: fmt.Sprintf("c%d", i), ResourceClaimTemplateName: ptr.To(tpl)})
		p.Spec.Containers[0].Resources.Claims = append(p.Spec.Containers[0].Resources.Claims, corev1.ResourceClaim{Name: fmt.Sprintf("c%d", i)})
	}
	if gated {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}
	}
	return p
}

// createPod creates the pod and returns it as created.
func (e *env) createPod(p *corev1.Pod) *corev1.Pod {
	e.t.Helper()
	out, err := e.client.CoreV1().Pods(e.ns).Create(e.ctx, p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return out
}

func (e *env) deletePod(name string) {
	err := e.client.CoreV1().Pods(e.ns).Delete(e.ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		e.t.Errorf("deleting pod %s: %v", name, err)
	}
}

// waitBound waits until kube-scheduler bound the pod and returns it.
func (e *env) waitBound(name string, timeout time.Duration) *corev1.Pod {
	e.t.Helper()
	var p *corev1.Pod
	e.poll("pod "+name+" bound", timeout, func() bool {
		var err error
		p, err = e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && p.Spec.NodeName != ""
	})
	return p
}

// claimsOf returns the pod's claims (created from templates).
func (e *env) claimsOf(p *corev1.Pod) []*resourceapi.ResourceClaim {
	e.t.Helper()
	var out []*resourceapi.ResourceClaim
	for _, s := range p.Status.ResourceClaimStatuses {
		if s.ResourceClaimName == nil {
			continue
		}
		c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, *s.ResourceClaimName, metav1.GetOptions{})
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, c)
	}
	return out
}

// nodeOf returns the node an allocation's node selector names.
func nodeOf(c *resourceapi.ResourceClaim) string {
	if c.Status.Allocation == nil || c.Status.Allocation.NodeSelector == nil {
		return ""
	}
	for _, term := range c.Status.Allocation.NodeSelector.NodeSelectorTerms {
		for _, f := range term.MatchFields {
			if f.Key == "metadata.name" && len(f.Values) == 1 {
				return f.Values[0]
			}
		}
	}
	return ""
}

// weakest returns the weakest link among a claim's whole GPUs on its node.
func (e *env) weakest(c *resourceapi.ResourceClaim) topology.Link {
	topo := e.topo[nodeOf(c)]
	var pos []int
	for _, r := range c.Status.Allocation.Devices.Results {
		i, err := driver.ParseDeviceName(r.Device)
		if err != nil {
			e.t.Fatal(err)
		}
		p, ok := topo.Position(i)
		if !ok {
			e.t.Fatalf("device %s not in topology of %s", r.Device, nodeOf(c))
		}
		pos = append(pos, p)
	}
	return topo.WeakestLink(pos)
}

func (e *env) checkInvariants() error {
	return controllertest.CheckClusterInvariants(e.ctx, e.client)
}

// events returns the notes of events about a pod.
func (e *env) events(pod string, uid types.UID) []string {
	l, err := e.client.EventsV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		return nil
	}
	var out []string
	for _, ev := range l.Items {
		if ev.Regarding.Name == pod && (uid == "" || ev.Regarding.UID == uid) {
			out = append(out, ev.Reason+": "+ev.Note)
		}
	}
	return out
}

func hasEvent(events []string, sub string) bool {
	for _, e := range events {
		if strings.Contains(e, sub) {
			return true
		}
	}
	return false
}

// startBound creates the pod and waits until it is bound.
func (e *env) startBound(p *corev1.Pod, timeout time.Duration) *corev1.Pod {
	e.t.Helper()
	e.createPod(p)
	return e.waitBound(p.Name, timeout)
}

// createNode creates an API-only node without the not-ready taint the
// NodeTaint admission plugin adds on create.
func (e *env) createNode(node *corev1.Node) {
	e.t.Helper()
	n, err := e.client.CoreV1().Nodes().Create(e.ctx, node, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	if err := localcluster.UntaintNewNode(e.ctx, e.client, n); err != nil {
		e.t.Fatal(err)
	}
}
