package steer

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	corelisters "k8s.io/client-go/listers/core/v1"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/client-go/tools/cache"
)

var (
	notReady = corev1.Taint{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute}
	gpuOnly  = corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	// ourKeyHard is the steering key with another effect, which is not
	// the controller's taint and must be left alone.
	ourKeyHard = corev1.Taint{Key: TaintKey, Effect: corev1.TaintEffectNoSchedule}
)

func node(name, rv string, taints ...corev1.Taint) *corev1.Node {
	return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name, ResourceVersion: rv, Labels: map[string]string{"l": "v"}},
		Spec: corev1.NodeSpec{Taints: taints}}
}

// harness is a Reconciler over a fake API server and a lister the test
// fills itself, so that the cache can be made stale on purpose.
type harness struct {
	r      *Reconciler
	client *fake.Clientset
	store  cache.Indexer
	want   map[string]bool
	added  int
	remove int
}

func newHarness(t *testing.T, enabled bool, api []*corev1.Node, cached []*corev1.Node) *harness {
	t.Helper()
	return newHarnessFor(t, Taint, enabled, api, cached)
}

// newHarnessFor is newHarness for a Reconciler of taint.
func newHarnessFor(t *testing.T, taint corev1.Taint, enabled bool, api []*corev1.Node, cached []*corev1.Node) *harness {
	t.Helper()
	h := &harness{want: map[string]bool{}, store: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})}
	var objs []runtime.Object
	for _, n := range api {
		objs = append(objs, n.DeepCopy())
	}
	h.client = fake.NewClientset(objs...)
	for _, n := range cached {
		if err := h.store.Add(n.DeepCopy()); err != nil {
			t.Fatal(err)
		}
	}
	r, err := New(Config{Client: h.client, Nodes: corelisters.NewNodeLister(h.store), Taint: taint, Enabled: enabled,
		Want: func(n string) bool { return h.want[n] },
		Writes: func(added bool) {
			if added {
				h.added++
			} else {
				h.remove++
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	h.r = r
	return h
}

func (h *harness) taints(t *testing.T, name string) []corev1.Taint {
	t.Helper()
	n, err := h.client.CoreV1().Nodes().Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return n.Spec.Taints
}

func (h *harness) patches() []k8stesting.PatchAction {
	var out []k8stesting.PatchAction
	for _, a := range h.client.Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetVerb() == "patch" {
			out = append(out, p)
		}
	}
	return out
}

func sameTaints(a, b []corev1.Taint) bool {
	return slices.EqualFunc(a, b, func(x, y corev1.Taint) bool { return x.MatchTaint(&y) && x.Value == y.Value })
}

func TestSyncAddsTaintKeepingOthers(t *testing.T) {
	n := node("full", "5", notReady, gpuOnly)
	h := newHarness(t, true, []*corev1.Node{n}, []*corev1.Node{n})
	h.want["full"] = true
	if err := h.r.sync(context.Background(), "full"); err != nil {
		t.Fatal(err)
	}
	if got, want := h.taints(t, "full"), []corev1.Taint{notReady, gpuOnly, Taint}; !sameTaints(got, want) {
		t.Errorf("taints %v, want %v", got, want)
	}
	if h.added != 1 || h.remove != 0 || len(h.patches()) != 1 {
		t.Errorf("writes: %d added, %d removed, %d patches; want 1, 0, 1", h.added, h.remove, len(h.patches()))
	}
}

func TestSyncAddsFirstTaint(t *testing.T) {
	n := node("bare", "5")
	h := newHarness(t, true, []*corev1.Node{n}, []*corev1.Node{n})
	h.want["bare"] = true
	if err := h.r.sync(context.Background(), "bare"); err != nil {
		t.Fatal(err)
	}
	if got := h.taints(t, "bare"); !sameTaints(got, []corev1.Taint{Taint}) {
		t.Errorf("taints %v, want only the steering taint", got)
	}
}

func TestSyncRemovesOnlyItsTaint(t *testing.T) {
	n := node("full", "5", gpuOnly, Taint, ourKeyHard, notReady)
	h := newHarness(t, true, []*corev1.Node{n}, []*corev1.Node{n})
	h.want["full"] = false
	if err := h.r.sync(context.Background(), "full"); err != nil {
		t.Fatal(err)
	}
	if got, want := h.taints(t, "full"), []corev1.Taint{gpuOnly, ourKeyHard, notReady}; !sameTaints(got, want) {
		t.Errorf("taints %v, want %v (the steering key with NoSchedule is not ours to remove)", got, want)
	}
	if h.remove != 1 {
		t.Errorf("removals counted: %d, want 1", h.remove)
	}
}

func TestSyncWritesOnlyOnTransitions(t *testing.T) {
	tainted := node("free", "5", Taint)
	plain := node("full", "5", gpuOnly)
	h := newHarness(t, true, []*corev1.Node{tainted, plain}, []*corev1.Node{tainted, plain})
	h.want["free"] = true
	for range 3 {
		for _, name := range []string{"free", "full", "gone"} {
			if err := h.r.sync(context.Background(), name); err != nil {
				t.Fatal(err)
			}
		}
	}
	if p := h.patches(); len(p) != 0 {
		t.Errorf("%d patches for nodes already in step (and a node that is gone), want none", len(p))
	}
}

func TestSyncOffRemovesEveryTaint(t *testing.T) {
	a := node("a", "5", Taint)
	b := node("b", "5", gpuOnly, Taint)
	c := node("c", "5", gpuOnly)
	h := newHarness(t, false, []*corev1.Node{a, b, c}, []*corev1.Node{a, b, c})
	// Want is not consulted when off: a node it would taint is cleaned.
	h.want["a"], h.want["c"] = true, true
	for _, name := range []string{"a", "b", "c"} {
		if err := h.r.sync(context.Background(), name); err != nil {
			t.Fatal(err)
		}
	}
	for name, want := range map[string][]corev1.Taint{"a": nil, "b": {gpuOnly}, "c": {gpuOnly}} {
		if got := h.taints(t, name); !sameTaints(got, want) {
			t.Errorf("node %s: taints %v, want %v", name, got, want)
		}
	}
	if h.remove != 2 || h.added != 0 {
		t.Errorf("writes: %d removed, %d added; want 2, 0", h.remove, h.added)
	}
}

// A cache that has not seen another writer's taint yet: the patch's test
// fails on the API server, and the node is read again and patched as it
// is there.
func TestSyncStaleCacheRereads(t *testing.T) {
	cached := node("n", "5")
	api := node("n", "6", notReady)
	h := newHarness(t, true, []*corev1.Node{api}, []*corev1.Node{cached})
	h.want["n"] = true
	if err := h.r.sync(context.Background(), "n"); err != nil {
		t.Fatal(err)
	}
	if got, want := h.taints(t, "n"), []corev1.Taint{notReady, Taint}; !sameTaints(got, want) {
		t.Errorf("taints %v, want %v: the other writer's taint must survive", got, want)
	}
	if n := len(h.patches()); n != 2 {
		t.Errorf("%d patches, want 2 (the refused one, then the one on the node read again)", n)
	}
}

// The cache still shows the taint at index 0, the API server has another
// taint in front of it: the removal's test refuses to remove the wrong
// taint, and the retry removes the right one.
func TestSyncRemovalTestsIndex(t *testing.T) {
	cached := node("n", "5", Taint)
	api := node("n", "6", notReady, Taint)
	h := newHarness(t, true, []*corev1.Node{api}, []*corev1.Node{cached})
	if err := h.r.sync(context.Background(), "n"); err != nil {
		t.Fatal(err)
	}
	if got, want := h.taints(t, "n"), []corev1.Taint{notReady}; !sameTaints(got, want) {
		t.Errorf("taints %v, want %v", got, want)
	}
}

func TestEnqueueCoalesces(t *testing.T) {
	h := newHarness(t, true, nil, nil)
	for range 5 {
		h.r.Enqueue("a")
		h.r.Enqueue("b")
	}
	h.r.Enqueue("")
	if n := h.r.queue.Len(); n != 2 {
		t.Errorf("queue holds %d keys, want 2 (one per node)", n)
	}
}

func TestNodeChangedOnlyOnTaints(t *testing.T) {
	h := newHarness(t, true, nil, nil)
	a := node("a", "1", gpuOnly)
	b := a.DeepCopy()
	b.ResourceVersion, b.Labels = "2", map[string]string{"other": "x"}
	h.r.NodeChanged(a, b)
	if n := h.r.queue.Len(); n != 0 {
		t.Errorf("a label change queued %d nodes, want 0", n)
	}
	c := b.DeepCopy()
	c.Spec.Taints = nil
	h.r.NodeChanged(b, c)
	h.r.NodeChanged(nil, node("new", "1"))
	if n := h.r.queue.Len(); n != 2 {
		t.Errorf("a taint change and a new node queued %d nodes, want 2", n)
	}
}

func TestPatchNothingToDo(t *testing.T) {
	for _, tc := range []struct {
		name string
		n    *corev1.Node
		add  bool
	}{
		{"add, present", node("n", "1", gpuOnly, Taint), true},
		{"remove, absent", node("n", "1", gpuOnly, ourKeyHard), false},
	} {
		p, err := Patch(tc.n, Taint, tc.add)
		if err != nil || p != nil {
			t.Errorf("%s: patch %s, %v; want none", tc.name, p, err)
		}
	}
}

func TestNewValidates(t *testing.T) {
	store := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	for _, cfg := range []Config{
		{Nodes: corelisters.NewNodeLister(store), Taint: Taint},
		{Client: fake.NewClientset(), Nodes: corelisters.NewNodeLister(store), Taint: Taint, Enabled: true},
		{Client: fake.NewClientset(), Nodes: corelisters.NewNodeLister(store), Taint: Taint, WritesPerSecond: -1},
		{Client: fake.NewClientset(), Nodes: corelisters.NewNodeLister(store)},
		{Client: fake.NewClientset(), Nodes: corelisters.NewNodeLister(store), Taint: ourKeyHard},
		{Client: fake.NewClientset(), Nodes: corelisters.NewNodeLister(store), Taint: corev1.Taint{Key: "example.com/x", Effect: corev1.TaintEffectPreferNoSchedule}},
		{Client: fake.NewClientset(), Nodes: corelisters.NewNodeLister(store), Taint: corev1.Taint{Key: TaintKey, Value: "1", Effect: corev1.TaintEffectPreferNoSchedule}},
	} {
		if _, err := New(cfg); err == nil {
			t.Errorf("New(%+v) accepted", cfg)
		}
	}
}

// TestTwoTaintsOnOneNode: the scarce taint's Reconciler and the free-GPU
// one write the same node's taint list in turn; each adds and removes its
// own taint only, and both share one token bucket.
func TestTwoTaintsOnOneNode(t *testing.T) {
	ctx := context.Background()
	n := node("idle", "5", gpuOnly)
	free := newHarnessFor(t, Taint, true, []*corev1.Node{n}, nil)
	limiter, err := NewLimiter(0, 0)
	if err != nil {
		t.Fatal(err)
	}
	scarce, err := New(Config{Client: free.client, Nodes: corelisters.NewNodeLister(free.store), Taint: ScarceTaint,
		Enabled: true, Want: func(string) bool { return free.want["idle"] }, Limiter: limiter})
	if err != nil {
		t.Fatal(err)
	}
	if scarce.Key() != ScarceTaintKey || free.r.Key() != TaintKey {
		t.Fatalf("keys %s, %s", scarce.Key(), free.r.Key())
	}
	// The lister follows the API server, as the node informer would.
	refresh := func() {
		t.Helper()
		cur, err := free.client.CoreV1().Nodes().Get(ctx, "idle", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := free.store.Update(cur); err != nil {
			t.Fatal(err)
		}
	}
	refresh()
	free.want["idle"] = true
	for _, r := range []*Reconciler{free.r, scarce} {
		if err := r.sync(ctx, "idle"); err != nil {
			t.Fatal(err)
		}
		refresh()
	}
	if got, want := free.taints(t, "idle"), []corev1.Taint{gpuOnly, Taint, ScarceTaint}; !sameTaints(got, want) {
		t.Fatalf("both wanted: taints %v, want %v", got, want)
	}
	// Removing the free-GPU taint leaves the scarce one where it is.
	free.want["idle"] = false
	if err := free.r.sync(ctx, "idle"); err != nil {
		t.Fatal(err)
	}
	refresh()
	if got, want := free.taints(t, "idle"), []corev1.Taint{gpuOnly, ScarceTaint}; !sameTaints(got, want) {
		t.Fatalf("free-GPU taint removed: taints %v, want %v", got, want)
	}
	if err := scarce.sync(ctx, "idle"); err != nil {
		t.Fatal(err)
	}
	if got, want := free.taints(t, "idle"), []corev1.Taint{gpuOnly}; !sameTaints(got, want) {
		t.Fatalf("both removed: taints %v, want %v", got, want)
	}
}

// TestPatchScarceTaint: the patch of the second taint names its own key
// in the tests of a removal, so that it never removes the first.
func TestPatchScarceTaint(t *testing.T) {
	n := node("n", "1", Taint, ScarceTaint)
	p, err := Patch(n, ScarceTaint, false)
	if err != nil {
		t.Fatal(err)
	}
	want := `[{"op":"test","path":"/spec/taints/1/key","value":"` + ScarceTaintKey + `"},{"op":"test","path":"/spec/taints/1/effect","value":"PreferNoSchedule"},{"op":"remove","path":"/spec/taints/1"}]`
	if string(p) != want {
		t.Errorf("patch %s, want %s", p, want)
	}
	if p, err := Patch(node("n", "1", Taint), ScarceTaint, true); err != nil || string(p) != `[{"op":"add","path":"/spec/taints/-","value":{"key":"`+ScarceTaintKey+`","effect":"PreferNoSchedule"}}]` {
		t.Errorf("add patch %s, %v", p, err)
	}
}
