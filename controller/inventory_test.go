package controller

import (
	"errors"
	"reflect"
	"sort"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

func TestInventoryBuildsTopologyFromSlices(t *testing.T) {
	inv := planner.NewInventory()
	if err := inv.Upsert(controllertest.V100Slice(t, "n")); err != nil {
		t.Fatal(err)
	}
	n := inv.Node("n")
	if n == nil || n.Topo.Len() != 8 {
		t.Fatalf("node inventory %+v, want 8 GPUs", n)
	}
	topo, _ := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	for i := range 8 {
		for j := range 8 {
			if n.Topo.Link(i, j) != topo.Link(i, j) {
				t.Fatalf("link %d-%d is %s, the fixture says %s", i, j, n.Topo.Link(i, j), topo.Link(i, j))
			}
		}
	}
	if n.Topo.GPUs[0].MemoryBytes != 32<<30 {
		t.Errorf("GPU memory %d, want the published 32Gi", n.Topo.GPUs[0].MemoryBytes)
	}
	inv.Remove(controllertest.V100Slice(t, "n"))
	if inv.Node("n") != nil {
		t.Error("node still known after its slice was deleted")
	}
}

func TestInventoryRejectsBadPools(t *testing.T) {
	for name, mutate := range map[string]func(*resourceapi.ResourceSlice){
		"incomplete": func(s *resourceapi.ResourceSlice) { s.Spec.Pool.ResourceSliceCount = 2 },
		"no node":    func(s *resourceapi.ResourceSlice) { s.Spec.NodeName = nil; s.Spec.AllNodes = ptr.To(true) },
		"bad links": func(s *resourceapi.ResourceSlice) {
			s.Spec.Devices[0].Attributes[driver.AttrLinks] = resourceapi.DeviceAttribute{StringValue: ptr.To("X")}
		},
		"index mismatch": func(s *resourceapi.ResourceSlice) {
			s.Spec.Devices[0].Attributes[driver.AttrIndex] = resourceapi.DeviceAttribute{IntValue: ptr.To(int64(5))}
		},
		"bad device name": func(s *resourceapi.ResourceSlice) { s.Spec.Devices[0].Name = "gpu0" },
	} {
		t.Run(name, func(t *testing.T) {
			inv := planner.NewInventory()
			s := controllertest.V100Slice(t, "n")
			mutate(s)
			if err := inv.Upsert(s); err == nil {
				t.Fatal("unusable pool accepted")
			}
			if inv.Node("n") != nil {
				t.Error("unusable pool became a node")
			}
			if p := inv.ProblemsSnapshot(); !strings.Contains(p["n"], "pool") {
				t.Errorf("problems %v, want one for pool n", p)
			}
		})
	}
	// The newest generation wins.
	inv := planner.NewInventory()
	old := controllertest.V100Slice(t, "n")
	old.Name = "old"
	four, err := controllertest.ParseFixture("pcie-4.txt")
	if err != nil {
		t.Fatal(err)
	}
	newer, err := controllertest.Slice("n", four, controllertest.SliceOptions{Generation: 2})
	if err != nil {
		t.Fatal(err)
	}
	if err := inv.Upsert(old); err != nil {
		t.Fatal(err)
	}
	if err := inv.Upsert(newer); err != nil {
		t.Fatal(err)
	}
	if n := inv.Node("n"); n == nil || n.Topo.Len() != 4 {
		t.Errorf("node %+v, want the 4 GPUs of generation 2", n)
	}
}

func TestNodeFilter(t *testing.T) {
	logger, _ := ktesting.NewTestContext(t)
	cordoned := controllertest.Node("cordoned")
	cordoned.Spec.Unschedulable = true
	tainted := controllertest.Node("tainted")
	tainted.Spec.Taints = []corev1.Taint{{Key: "dedicated", Value: "infer", Effect: corev1.TaintEffectNoSchedule}}
	labelled := controllertest.Node("labelled")
	labelled.Labels["pool"] = "a"
	plain := controllertest.Node("plain")
	client := fake.NewClientset(cordoned, tainted, labelled, plain)
	f := informers.NewSharedInformerFactory(client, 0)
	lister := f.Core().V1().Nodes().Lister()
	f.Start(t.Context().Done())
	f.WaitForCacheSync(t.Context().Done())
	inv := planner.NewInventory()
	for _, n := range []string{"cordoned", "tainted", "labelled", "plain", "ghost"} {
		if err := inv.Upsert(controllertest.V100Slice(t, n)); err != nil {
			t.Fatal(err)
		}
	}
	filter := &planner.NodeFilter{Nodes: lister}
	names := func(pod *corev1.Pod, allocated []*resourceapi.ResourceClaim, excluded sets.Set[string]) []string {
		got, _ := filter.Candidates(logger, pod, inv.All(), allocated, excluded)
		var out []string
		for _, n := range got {
			out = append(out, n.Node)
		}
		return out
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}}
	if got := names(pod, nil, nil); strings.Join(got, ",") != "labelled,plain" {
		t.Errorf("plain pod: candidates %v, want labelled,plain (cordoned, tainted and node-less pools out)", got)
	}
	pod.Spec.NodeSelector = map[string]string{"pool": "a"}
	if got := names(pod, nil, nil); strings.Join(got, ",") != "labelled" {
		t.Errorf("pod with nodeSelector: candidates %v, want labelled", got)
	}
	pod.Spec.NodeSelector = nil
	pod.Spec.Tolerations = []corev1.Toleration{{Key: "dedicated", Operator: corev1.TolerationOpExists}}
	if got := names(pod, nil, sets.New("plain")); strings.Join(got, ",") != "labelled,tainted" {
		t.Errorf("tolerating pod with plain excluded: candidates %v, want labelled,tainted", got)
	}
	other := &resourceapi.ResourceClaim{Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{NodeSelector: planner.NodeSelectorFor("tainted")}}}
	if got := names(pod, []*resourceapi.ResourceClaim{other}, nil); strings.Join(got, ",") != "tainted" {
		t.Errorf("pod with a claim allocated on tainted: candidates %v, want tainted", got)
	}
}

// A node's kubelet plugin may only describe its own node's GPUs: a slice
// whose pool is named after another node (the plugin on node-a publishing
// pool node-b at a newer generation) must neither hide node-b's GPUs nor
// replace node-a's, whichever order the slices arrive in.
func TestInventoryIgnoresPoolsNamedAfterAnotherNode(t *testing.T) {
	four, err := controllertest.ParseFixture("pcie-4.txt")
	if err != nil {
		t.Fatal(err)
	}
	forged, err := controllertest.Slice("node-a", four, controllertest.SliceOptions{Generation: 99})
	if err != nil {
		t.Fatal(err)
	}
	forged.Name = "forged"
	forged.Spec.Pool.Name = "node-b"
	check := func(t *testing.T, inv *planner.Inventory) {
		t.Helper()
		for _, node := range []string{"node-a", "node-b"} {
			if n := inv.Node(node); n == nil || n.Topo.Len() != 8 || n.Pool != node {
				t.Errorf("node %s: inventory %+v, want its own 8-GPU pool %s", node, n, node)
			}
		}
	}
	for name, forgedFirst := range map[string]bool{"forged slice last": false, "forged slice first": true} {
		t.Run(name, func(t *testing.T) {
			inv := planner.NewInventory()
			upsertForged := func() {
				err := inv.Upsert(forged)
				if err == nil || !strings.Contains(err.Error(), `pool "node-b"`) || !strings.Contains(err.Error(), `node "node-a"`) {
					t.Errorf("upsert of the forged slice: error %v, want one naming pool node-b and node node-a", err)
				}
			}
			if forgedFirst {
				upsertForged()
			}
			for _, node := range []string{"node-a", "node-b"} {
				if err := inv.Upsert(controllertest.V100Slice(t, node)); err != nil {
					t.Fatal(err)
				}
			}
			if !forgedFirst {
				upsertForged()
			}
			check(t, inv)
			inv.Remove(forged)
			check(t, inv)
		})
	}

	// A slice that was accepted and is then rewritten to name another
	// node's pool is dropped: its old pool goes with it, and the pool it
	// now names is untouched.
	inv := planner.NewInventory()
	for _, node := range []string{"node-a", "node-b"} {
		if err := inv.Upsert(controllertest.V100Slice(t, node)); err != nil {
			t.Fatal(err)
		}
	}
	moved := controllertest.V100Slice(t, "node-a")
	moved.Spec.Pool.Name = "node-b"
	moved.Spec.Pool.Generation = 99
	if err := inv.Upsert(moved); err == nil {
		t.Error("slice moved to another node's pool accepted")
	}
	if n := inv.Node("node-a"); n != nil {
		t.Errorf("node-a still has pool %s after its only slice left it", n.Pool)
	}
	if n := inv.Node("node-b"); n == nil || n.Topo.Len() != 8 {
		t.Errorf("node-b: inventory %+v, want its own 8 GPUs", n)
	}
}

// A pool split across nodes (a second slice of pool n published for node
// m) never becomes one node's inventory: the slice naming m is ignored, so
// pool n stays incomplete and unusable, and node m's own pool is untouched.
func TestInventoryRefusesPoolSplitAcrossNodes(t *testing.T) {
	inv := planner.NewInventory()
	if err := inv.Upsert(controllertest.V100Slice(t, "m")); err != nil {
		t.Fatal(err)
	}
	first := controllertest.V100Slice(t, "n")
	first.Name = "n-1"
	first.Spec.Pool.ResourceSliceCount = 2
	second := controllertest.V100Slice(t, "m")
	second.Name = "n-2"
	second.Spec.Pool = first.Spec.Pool
	if err := inv.Upsert(first); err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Errorf("first half of pool n: error %v, want the pool reported incomplete", err)
	}
	var foreign *sliceformat.ForeignPoolError
	if err := inv.Upsert(second); !errors.As(err, &foreign) {
		t.Errorf("slice of pool n on node m: error %v, want a sliceformat.ForeignPoolError", err)
	}
	if n := inv.Node("n"); n != nil {
		t.Errorf("pool n split across nodes became node %s's inventory", n.Node)
	}
	if p := inv.ProblemsSnapshot(); !strings.Contains(p["n"], "incomplete") {
		t.Errorf("problems %v, want pool n incomplete", p)
	}
	if n := inv.Node("m"); n == nil || n.Pool != "m" || n.Topo.Len() != 8 {
		t.Errorf("node m: inventory %+v, want its own pool m", n)
	}
}

// The controller records a warning on a slice it ignores for naming
// another node's pool, and still allocates that node's GPUs.
func TestControllerWarnsAboutForeignPoolSlice(t *testing.T) {
	four := fixtureTopology(t, "pcie-4.txt")
	forged, err := controllertest.Slice("node-a", four, controllertest.SliceOptions{Generation: 99})
	if err != nil {
		t.Fatal(err)
	}
	forged.Name = "forged"
	forged.Spec.Pool.Name = "node-b"
	h := newHarness(t, objs(classes(), gpuNode(t, "node-b", "v100-sxm2-8-aliyun-sccgn6.txt"), []runtime.Object{forged})...).start()
	e := h.waitEvent("/forged", report.ReasonSliceIgnored)
	if e.Type != corev1.EventTypeWarning || !strings.Contains(e.Note, `pool "node-b"`) || !strings.Contains(e.Note, `node "node-a"`) {
		t.Errorf("event %+v, want a warning naming pool node-b and node node-a", e)
	}
	h.claim("eight", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 8)}})
	h.pod("p", true, "eight")
	if got := allocatedNode(h.waitAllocated("eight")); got != "node-b" {
		t.Errorf("claim allocated on %q, want node-b's own 8 GPUs", got)
	}
}

// The index of slices by pool stays in step with the stored slices through
// adds, updates, pool moves, refused updates and removals, and a pool's
// rebuild sees exactly its own slices.
func TestInventoryPoolIndexConsistent(t *testing.T) {
	inv := planner.NewInventory()
	check := func(step string, want map[string][]string) {
		t.Helper()
		got := map[string][]string{}
		indexed := 0
		for pool, byName := range inv.ByPool {
			if len(byName) == 0 {
				t.Errorf("%s: empty index entry for pool %q kept", step, pool)
			}
			for name, s := range byName {
				indexed++
				if stored := inv.Slices[name]; stored != s {
					t.Errorf("%s: index has slice %q in pool %q, stored is %v", step, name, pool, stored)
				}
				if s.Spec.Pool.Name != pool {
					t.Errorf("%s: slice %q of pool %q indexed under pool %q", step, name, s.Spec.Pool.Name, pool)
				}
				got[pool] = append(got[pool], name)
			}
		}
		if indexed != len(inv.Slices) {
			t.Errorf("%s: %d slices indexed, %d stored", step, indexed, len(inv.Slices))
		}
		for pool := range got {
			sort.Strings(got[pool])
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: index %v, want %v", step, got, want)
		}
		for pool := range want {
			if n := inv.Node(pool); n == nil || n.Pool != pool {
				t.Errorf("%s: node %s: inventory %+v, want pool %s", step, pool, n, pool)
			}
		}
		for _, n := range inv.All() {
			if _, ok := want[n.Pool]; !ok {
				t.Errorf("%s: node %s of pool %s left over", step, n.Node, n.Pool)
			}
		}
	}
	a, b := controllertest.V100Slice(t, "a"), controllertest.V100Slice(t, "b")
	for _, s := range []*resourceapi.ResourceSlice{a, b} {
		if err := inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	check("add", map[string][]string{"a": {a.Name}, "b": {b.Name}})

	a2 := controllertest.V100Slice(t, "a")
	a2.Spec.Pool.Generation = 2
	if err := inv.Upsert(a2); err != nil {
		t.Fatal(err)
	}
	check("update", map[string][]string{"a": {a.Name}, "b": {b.Name}})
	if inv.ByPool["a"][a.Name] != a2 {
		t.Error("update: index still holds the old version of the slice")
	}

	c := controllertest.V100Slice(t, "c")
	if err := inv.Upsert(c); err != nil {
		t.Fatal(err)
	}
	check("add c", map[string][]string{"a": {a.Name}, "b": {b.Name}, "c": {c.Name}})
	moved := controllertest.V100Slice(t, "d")
	moved.Name = c.Name
	if err := inv.Upsert(moved); err != nil {
		t.Fatal(err)
	}
	check("pool move", map[string][]string{"a": {a.Name}, "b": {b.Name}, "d": {c.Name}})

	refused := controllertest.V100Slice(t, "d")
	refused.Name = c.Name
	refused.Spec.Pool.Name = "b"
	if err := inv.Upsert(refused); err == nil {
		t.Error("refused update: slice naming another node's pool accepted")
	}
	check("refused update", map[string][]string{"a": {a.Name}, "b": {b.Name}})

	forged := controllertest.V100Slice(t, "a")
	forged.Name = "forged"
	forged.Spec.Pool.Name = "b"
	if err := inv.Upsert(forged); err == nil {
		t.Error("refused add: slice naming another node's pool accepted")
	}
	check("refused add", map[string][]string{"a": {a.Name}, "b": {b.Name}})
	inv.Remove(forged)
	check("remove refused", map[string][]string{"a": {a.Name}, "b": {b.Name}})

	// The deleted object names another pool than the stored version: the
	// stored version's pool is the one that loses it.
	stale := controllertest.V100Slice(t, "e")
	stale.Name = a.Name
	inv.Remove(stale)
	check("remove", map[string][]string{"b": {b.Name}})
	inv.Remove(b)
	check("remove last", map[string][]string{})
}
