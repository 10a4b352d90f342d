package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	jsonpatch "gopkg.in/evanphx/json-patch.v4"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// recordedEvent is one event the controller recorded.
type recordedEvent struct {
	Object, Type, Reason, Note string
}

// testRecorder keeps events in memory (events.FakeRecorder blocks when its
// channel is full).
type testRecorder struct {
	mu     sync.Mutex
	events []recordedEvent
}

func (r *testRecorder) Eventf(regarding runtime.Object, _ runtime.Object, eventtype, reason, _ string, note string, args ...any) {
	obj := ""
	if m, err := metaOf(regarding); err == nil {
		obj = m.GetNamespace() + "/" + m.GetName()
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, recordedEvent{Object: obj, Type: eventtype, Reason: reason, Note: fmt.Sprintf(note, args...)})
}

func metaOf(obj runtime.Object) (metav1.Object, error) {
	m, ok := obj.(metav1.Object)
	if !ok {
		return nil, fmt.Errorf("%T has no metadata", obj)
	}
	return m, nil
}

func (r *testRecorder) find(object, reason string) (recordedEvent, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		e := r.events[i]
		if e.Object == object && e.Reason == reason {
			return e, true
		}
	}
	return recordedEvent{}, false
}

type harness struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	rec    *testRecorder
	ctrl   *Controller
	cancel context.CancelFunc
	done   chan struct{}
	// podUpdates and claimUpdates hold back the controller's pod and
	// claim updates while held (holdPodUpdates, holdClaimUpdates).
	podUpdates, claimUpdates *eventHold
}

const ns = "default"

// fixtureTopology parses a topology file from driver/topology/testdata.
func fixtureTopology(t testing.TB, name string) *topology.Topology {
	t.Helper()
	topo, err := topology.ParseFile("../driver/topology/testdata/" + name)
	if err != nil {
		t.Fatalf("parsing fixture %s: %v", name, err)
	}
	return topo
}

// gpuNode returns the node object and its slice for a fixture.
func gpuNode(t *testing.T, name, fixture string) []runtime.Object {
	t.Helper()
	s, err := controllertest.Slice(name, fixtureTopology(t, fixture), controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return []runtime.Object{controllertest.Node(name), s}
}

func classes() []runtime.Object {
	var out []runtime.Object
	for _, c := range planner.DeviceClasses() {
		out = append(out, c)
	}
	return out
}

func newHarness(t *testing.T, objs ...runtime.Object) *harness {
	return newHarnessWith(t, Config{Workers: 2, DeviceTaintRules: true}, objs...)
}

func newHarnessWith(t *testing.T, cfg Config, objs ...runtime.Object) *harness {
	t.Helper()
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	h := &harness{t: t, ctx: ctx, client: fake.NewClientset(objs...), rec: &testRecorder{}, cancel: cancel, done: make(chan struct{}), podUpdates: &eventHold{}, claimUpdates: &eventHold{}}
	withResourceVersions(h.client)
	copyWatchEvents(h.client, map[string]*eventHold{"pods": h.podUpdates, "resourceclaims": h.claimUpdates})
	cfg.Client = h.client
	cfg.Recorder = h.rec
	if cfg.Policy == (allocate.Policy{}) {
		cfg.Policy = allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}
	}
	ctrl, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	h.ctrl = ctrl
	t.Cleanup(h.stop)
	return h
}

// withResourceVersions makes the fake clientset behave like an API server
// for optimistic concurrency: every write gets a new, increasing
// resourceVersion, and an update carrying a stale one is a conflict.
func withResourceVersions(client *fake.Clientset) {
	var rv atomic.Int64
	rv.Store(1000)
	client.PrependReactor("create", "*", func(action clienttesting.Action) (bool, runtime.Object, error) {
		if m, err := meta.Accessor(action.(clienttesting.CreateAction).GetObject()); err == nil {
			m.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		}
		return false, nil, nil
	})
	client.PrependReactor("update", "*", func(action clienttesting.Action) (bool, runtime.Object, error) {
		ua := action.(clienttesting.UpdateAction)
		m, err := meta.Accessor(ua.GetObject())
		if err != nil {
			return false, nil, nil
		}
		cur, err := client.Tracker().Get(ua.GetResource(), ua.GetNamespace(), m.GetName())
		if err != nil {
			return false, nil, nil
		}
		cm, err := meta.Accessor(cur)
		if err != nil {
			return false, nil, nil
		}
		if m.GetResourceVersion() != "" && m.GetResourceVersion() != cm.GetResourceVersion() {
			return true, nil, apierrors.NewConflict(ua.GetResource().GroupResource(), m.GetName(),
				fmt.Errorf("resourceVersion %s is stale, current is %s", m.GetResourceVersion(), cm.GetResourceVersion()))
		}
		m.SetResourceVersion(strconv.FormatInt(rv.Add(1), 10))
		return false, nil, nil
	})
	// A JSON patch of a node (the steering taints) gets a new
	// resourceVersion too, so that a patch testing the version it was
	// made from fails once the node changed, and a second taint of a key
	// and effect the node has is refused, as the API server's validation
	// does: without both, a patch made from a stale informer cache wrote
	// the same taint twice.
	client.PrependReactor("patch", "nodes", func(action clienttesting.Action) (bool, runtime.Object, error) {
		pa := action.(clienttesting.PatchAction)
		if pa.GetPatchType() != types.JSONPatchType {
			return false, nil, nil
		}
		cur, err := client.Tracker().Get(pa.GetResource(), "", pa.GetName())
		if err != nil {
			return false, nil, nil
		}
		invalid := func(err error) error {
			return apierrors.NewInvalid(schema.GroupKind{Kind: "Node"}, pa.GetName(), field.ErrorList{field.Invalid(field.NewPath("patch"), string(pa.GetPatch()), err.Error())})
		}
		raw, err := json.Marshal(cur)
		if err != nil {
			return true, nil, err
		}
		patch, err := jsonpatch.DecodePatch(pa.GetPatch())
		if err != nil {
			return true, nil, apierrors.NewBadRequest(err.Error())
		}
		out, err := patch.Apply(raw)
		if err != nil {
			return true, nil, invalid(err)
		}
		node := &corev1.Node{}
		if err := json.Unmarshal(out, node); err != nil {
			return true, nil, invalid(err)
		}
		for i := range node.Spec.Taints {
			for j := range i {
				if node.Spec.Taints[i].MatchTaint(&node.Spec.Taints[j]) {
					return true, nil, invalid(fmt.Errorf("taint %s:%s given twice", node.Spec.Taints[i].Key, node.Spec.Taints[i].Effect))
				}
			}
		}
		node.ResourceVersion = strconv.FormatInt(rv.Add(1), 10)
		if err := client.Tracker().Update(pa.GetResource(), node, ""); err != nil {
			return true, nil, err
		}
		return true, node.DeepCopy(), nil
	})
}

// copyWatchEvents makes the fake clientset's watches deliver copies, as an
// API server's decoded events are: the fake hands out the object its
// tracker stores, and the informers' transform (stripManagedFields)
// would then write to it while a Get of the tracker copies it (a data
// race the race detector reports).
func copyWatchEvents(client *fake.Clientset, holds map[string]*eventHold) {
	client.PrependWatchReactor("*", func(action clienttesting.Action) (bool, watch.Interface, error) {
		var opts metav1.ListOptions
		if wa, ok := action.(clienttesting.WatchActionImpl); ok {
			opts = wa.ListOptions
		}
		w, err := client.Tracker().Watch(action.GetResource(), action.GetNamespace(), opts)
		if err != nil {
			return false, nil, err
		}
		copied := watch.Filter(w, func(e watch.Event) (watch.Event, bool) {
			if e.Object != nil {
				e.Object = e.Object.DeepCopyObject()
			}
			return e, true
		})
		if hold, ok := holds[action.GetResource().Resource]; ok {
			return true, hold.apply(copied), nil
		}
		return true, copied, nil
	})
}

// eventHold holds back the Modified events of a watch while held, as an
// informer that lags the API server does, keeping the order of every
// event. Added events pass until one is held behind a Modified one.
type eventHold struct {
	mu sync.RWMutex
}

// hold holds back Modified events until the returned release is called
// (at the latest when the test ends).
func (e *eventHold) hold(t *testing.T) (release func()) {
	e.mu.Lock()
	release = sync.OnceFunc(e.mu.Unlock)
	t.Cleanup(release)
	return release
}

// apply forwards w's events, waiting for a release before each Modified
// one.
func (e *eventHold) apply(w watch.Interface) watch.Interface {
	out := make(chan watch.Event)
	proxy := watch.NewProxyWatcher(out)
	go func() {
		defer close(out)
		defer w.Stop()
		for {
			select {
			case ev, ok := <-w.ResultChan():
				if !ok {
					return
				}
				if ev.Type == watch.Modified {
					e.mu.RLock()
					e.mu.RUnlock() //nolint:staticcheck // waits for a release, guards nothing
				}
				select {
				case out <- ev:
				case <-proxy.StopChan():
					return
				}
			case <-proxy.StopChan():
				return
			}
		}
	}()
	return proxy
}

// holdPodUpdates makes the controller's pod informer lag the API server:
// pod updates (a gate removed, a binding) reach it only after release.
func (h *harness) holdPodUpdates() (release func()) {
	return h.podUpdates.hold(h.t)
}

// holdClaimUpdates makes the controller's claim informer lag the API
// server: claim updates (an allocation written or removed) reach it only
// after release.
func (h *harness) holdClaimUpdates() (release func()) {
	return h.claimUpdates.hold(h.t)
}

func (h *harness) start() *harness {
	go func() {
		defer close(h.done)
		// Ready can be true before Run's own wait for the caches sees
		// it; a test that ends in between cancels that wait, which is no
		// failure (start already saw the caches synced).
		if err := h.ctrl.Run(h.ctx); err != nil && !errors.Is(err, context.Canceled) {
			h.t.Errorf("controller: %v", err)
		}
	}()
	h.eventually("caches synced", h.ctrl.Ready)
	return h
}

func (h *harness) stop() {
	h.cancel()
	select {
	case <-h.done:
	case <-time.After(10 * time.Second):
		h.t.Error("controller did not stop")
	}
}

func (h *harness) eventually(what string, cond func() bool) {
	h.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	h.t.Fatalf("timed out waiting for %s", what)
}

// oneGPUClaims creates a claim for one whole GPU under each name.
func (h *harness) oneGPUClaims(names ...string) {
	h.t.Helper()
	for _, name := range names {
		h.claim(name, resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	}
}

// claim creates a claim with the given requests (and optional config/constraints).
func (h *harness) claim(name string, spec resourceapi.DeviceClaim) *resourceapi.ResourceClaim {
	h.t.Helper()
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()}, Spec: resourceapi.ResourceClaimSpec{Devices: spec}}
	out, err := h.client.ResourceV1().ResourceClaims(ns).Create(h.ctx, c, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

// pod creates a pod using the named claims, gated unless ungated is set.
func (h *harness) pod(name string, gated bool, claims ...string) *corev1.Pod {
	h.t.Helper()
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(), CreationTimestamp: metav1.Now()},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}}},
	}
	for _, c := range claims {
		p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: c, ResourceClaimName: ptr.To(c)})
	}
	if gated {
		p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}}
	}
	out, err := h.client.CoreV1().Pods(ns).Create(h.ctx, p, metav1.CreateOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return out
}

func (h *harness) getClaim(name string) *resourceapi.ResourceClaim {
	h.t.Helper()
	c, err := h.client.ResourceV1().ResourceClaims(ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return c
}

func (h *harness) getPod(name string) *corev1.Pod {
	h.t.Helper()
	p, err := h.client.CoreV1().Pods(ns).Get(h.ctx, name, metav1.GetOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return p
}

// waitAllocated waits until the claim is allocated and returns it.
func (h *harness) waitAllocated(name string) *resourceapi.ResourceClaim {
	h.t.Helper()
	var c *resourceapi.ResourceClaim
	h.eventually("claim "+name+" allocated", func() bool {
		c = h.getClaim(name)
		return c.Status.Allocation != nil
	})
	return c
}

func (h *harness) waitUngated(name string) {
	h.t.Helper()
	h.eventually("pod "+name+" ungated", func() bool { return gateIndex(h.getPod(name)) < 0 })
}

func (h *harness) waitEvent(object, reason string) recordedEvent {
	h.t.Helper()
	var e recordedEvent
	h.eventually(fmt.Sprintf("event %s on %s", reason, object), func() bool {
		var ok bool
		e, ok = h.rec.find(object, reason)
		return ok
	})
	return e
}

func (h *harness) allClaims() []resourceapi.ResourceClaim {
	l, err := h.client.ResourceV1().ResourceClaims("").List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return l.Items
}

func (h *harness) allSlices() []resourceapi.ResourceSlice {
	l, err := h.client.ResourceV1().ResourceSlices().List(h.ctx, metav1.ListOptions{})
	if err != nil {
		h.t.Fatal(err)
	}
	return l.Items
}

// devicesOf returns the device names of a claim's results, in order.
func devicesOf(c *resourceapi.ResourceClaim) []string {
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Device)
	}
	return out
}

func indices(t *testing.T, names []string) []int {
	t.Helper()
	var out []int
	for _, n := range names {
		i, err := driver.ParseDeviceName(n)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, i)
	}
	return out
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }
