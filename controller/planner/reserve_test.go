package planner

import (
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
)

// reservePlanner is a planner ranking by stranding over one 8-GPU node
// with 128 cores ("big") and twenty with 96 ("small-0".."small-19"): a
// pod asking for 8 GPUs and 120 cores fits big alone, 1/21 of the GPUs,
// which the demand mix weighs as scarce (21 >= ReserveScarcity).
func reservePlanner(t *testing.T, mixChanged func()) (*Planner, *Ledger, *FitTracker) {
	t.Helper()
	return reservePlannerOf(t, 20, mixChanged)
}

// reservePlannerOf is reservePlanner with smalls 96-core nodes.
func reservePlannerOf(t *testing.T, smalls int, mixChanged func()) (*Planner, *Ledger, *FitTracker) {
	t.Helper()
	inv := NewInventory()
	fit := NewFitTracker()
	filter := &NodeFilter{Fit: fit}
	addReserveNode(t, inv, filter, "big", "128")
	for i := range smalls {
		addReserveNode(t, inv, filter, fmt.Sprintf("small-%d", i), "96")
	}
	ledger := NewLedger()
	p, err := New(Config{Inventory: inv, Ledger: ledger, Filter: filter, Selectors: NewSelectorEvaluator(),
		RankByStranding: true, DemandChanged: mixChanged})
	if err != nil {
		t.Fatal(err)
	}
	return p, ledger, fit
}

// addReserveNode publishes an 8-GPU V100 node with cpu cores and 768Gi
// allocatable, each GPU carrying taints besides the managed one.
func addReserveNode(t *testing.T, inv *Inventory, filter *NodeFilter, name, cpu string, taints ...resourceapi.DeviceTaint) {
	t.Helper()
	topo, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range s.Spec.Devices {
		s.Spec.Devices[i].Taints = append(s.Spec.Devices[i].Taints, taints...)
	}
	if err := inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
	n := controllertest.Node(name)
	n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu)
	n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("768Gi")
	filter.Allocatable.Set(n)
}

func cpuPod(uid, cpu string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}}}
}

// recordScarceMix records one snapshot's worth of decided pods in p's
// demand history: one in eight of shape scarce, the others a 1-GPU pod
// of 8 cores that any node runs.
func recordScarceMix(t *testing.T, p *Planner, scarce allocate.DemandShape) {
	t.Helper()
	common := allocate.DemandShape{GPUs: 1, Host: allocate.Host{CPUMilli: 8000, MemoryBytes: 32 << 30}}
	for i := range demandRefresh {
		shape := common
		if i%8 == 0 {
			shape = scarce
		}
		if err := p.demand.hist.Record(shape); err != nil {
			t.Fatal(err)
		}
	}
}

func TestReservedForScarce(t *testing.T) {
	changed := 0
	p, ledger, fit := reservePlanner(t, func() { changed++ })
	if p.ReservedForScarce("big") {
		t.Fatal("kept before any mix was weighed")
	}
	recordScarceMix(t, p, allocate.DemandShape{GPUs: 8, Host: allocate.Host{CPUMilli: 120000, MemoryBytes: 64 << 30}})
	p.weighDemand()
	if changed != 1 {
		t.Fatalf("demand changes told: %d, want 1 for the first weighed mix", changed)
	}
	p.weighDemand()
	if changed != 1 {
		t.Fatalf("demand changes told: %d, want still 1 without a new snapshot", changed)
	}
	// 16 cores taken by a pod without GPUs leave 112, where the 8-GPU
	// pods need 120.
	checkKeptOnBig(t, fit, p.ReservedForScarce, "16")
	// One GPU given out: the node is not idle.
	claim := controllertest.ClaimWith("c", "1", resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver.Name, Pool: "big", Device: "gpu-0"})
	ledger.Observe(claim)
	if p.ReservedForScarce("big") {
		t.Error("kept with a GPU given out")
	}
	ledger.Forget(claim.UID)
	if !p.ReservedForScarce("big") {
		t.Error("not kept once the claim is gone")
	}
}

// Without ranking by stranding there is no demand mix: no node is kept.
func TestReservedForScarceNeedsTheMix(t *testing.T) {
	p, err := New(Config{Inventory: NewInventory(), Ledger: NewLedger(), Filter: &NodeFilter{}, Selectors: NewSelectorEvaluator()})
	if err != nil {
		t.Fatal(err)
	}
	p.weighDemand()
	if p.ReservedForScarce("big") {
		t.Error("a node kept without a demand mix")
	}
	if p.KeptForScarce("big") {
		t.Error("a node's shared GPUs kept without a demand mix")
	}
}

// KeptForScarce: the one node whose shared GPU's rest can still hold a
// share that needs 100 cores (1/400 of the unallocated GPU) keeps the
// first steering taint although none of its GPUs is idle; not once its
// cores are taken, and never a node the share does not fit.
func TestKeptForScarce(t *testing.T) {
	p, ledger, fit := reservePlannerOf(t, 40, nil)
	results := make([]resourceapi.DeviceRequestAllocationResult, 0, 8)
	for i := range 7 {
		r := controllertest.WholeResult(fmt.Sprintf("gpu-%d", i))
		r.Pool = "big"
		results = append(results, r)
	}
	share := controllertest.ShareResult("gpu-7", "4Gi", "20")
	share.Pool = "big"
	ledger.Observe(controllertest.ClaimWith("held", "1", append(results, share)...))
	if ledger.HasIdleGPU(p.inv.Node("big")) {
		t.Fatal("big has an idle GPU: the first taint would hold without KeptForScarce")
	}
	if p.KeptForScarce("big") {
		t.Fatal("kept before any mix was weighed")
	}
	recordScarceMix(t, p, allocate.DemandShape{GPUs: 1, ShareMilli: 250, Host: allocate.Host{CPUMilli: 100000, MemoryBytes: 64 << 30}})
	p.weighDemand()
	// 40 cores taken leave 88, where the share needs 100.
	checkKeptOnBig(t, fit, p.KeptForScarce, "40")
}

// checkKeptOnBig checks a planner whose scarce shape only node big can
// run: keep holds for big and for no other node, not while a pod without
// GPUs holds cores of big (too many for the shape), and again once that
// pod is gone.
func checkKeptOnBig(t *testing.T, fit *FitTracker, keep func(node string) bool, cores string) {
	t.Helper()
	if !keep("big") {
		t.Error("big, the one node the scarce shape can run on, is not kept")
	}
	for _, name := range []string{"small-0", "unknown"} {
		if keep(name) {
			t.Errorf("node %s kept: no scarce shape fits it", name)
		}
	}
	pod := cpuPod("cpu-only", cores)
	fit.Assume(pod, "big")
	if keep("big") {
		t.Errorf("big kept while a pod without GPUs holds %s of its cores", cores)
	}
	fit.Forget(pod.UID)
	if !keep("big") {
		t.Error("big not kept once the pod without GPUs is gone")
	}
}

// A GPU no pod can be given is no supply of its shapes. With a second
// 128-core node, the 8-GPU pods of 120 cores have 2 of 22 nodes (weighed
// 11 times: not scarce) and neither node is kept; with every GPU of the
// second node tainted unhealthy, the first is their only node again and
// is kept whole for them.
func TestTaintedGPUsAreNoSupply(t *testing.T) {
	unhealthy := resourceapi.DeviceTaint{Key: "gpu.gpulink.dev/unhealthy", Effect: resourceapi.DeviceTaintEffectNoExecute}
	for _, tc := range []struct {
		name     string
		taints   []resourceapi.DeviceTaint
		wantKept bool
	}{
		{"the second node healthy", nil, false},
		{"every GPU of the second node tainted", []resourceapi.DeviceTaint{unhealthy}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, _ := reservePlanner(t, nil)
			addReserveNode(t, p.inv, p.filter, "big-2", "128", tc.taints...)
			recordScarceMix(t, p, allocate.DemandShape{GPUs: 8, Host: allocate.Host{CPUMilli: 120000, MemoryBytes: 64 << 30}})
			p.weighDemand()
			if got := p.ReservedForScarce("big"); got != tc.wantKept {
				t.Errorf("big kept = %v, want %v", got, tc.wantKept)
			}
			if p.ReservedForScarce("big-2") {
				t.Error("big-2 kept, although its GPUs are tainted or the shape is not scarce")
			}
		})
	}
}
