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
	topo, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	inv := NewInventory()
	fit := NewFitTracker()
	filter := &NodeFilter{Fit: fit}
	add := func(name, cpu string) {
		s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
		n := controllertest.Node(name)
		n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse(cpu)
		n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("768Gi")
		filter.Allocatable.Set(n)
	}
	add("big", "128")
	for i := range 20 {
		add(fmt.Sprintf("small-%d", i), "96")
	}
	ledger := NewLedger()
	p, err := New(Config{Inventory: inv, Ledger: ledger, Filter: filter, Selectors: NewSelectorEvaluator(),
		RankByStranding: true, DemandChanged: mixChanged})
	if err != nil {
		t.Fatal(err)
	}
	return p, ledger, fit
}

func cpuPod(uid, cpu string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: uid, Namespace: "ns", UID: types.UID(uid)},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse(cpu)}}}}}}
}

func TestReservedForScarce(t *testing.T) {
	changed := 0
	p, ledger, fit := reservePlanner(t, func() { changed++ })
	if p.ReservedForScarce("big") {
		t.Fatal("kept before any mix was weighed")
	}
	scarce := allocate.DemandShape{GPUs: 8, Host: allocate.Host{CPUMilli: 120000, MemoryBytes: 64 << 30}}
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
	p.weighDemand()
	if changed != 1 {
		t.Fatalf("demand changes told: %d, want 1 for the first weighed mix", changed)
	}
	p.weighDemand()
	if changed != 1 {
		t.Fatalf("demand changes told: %d, want still 1 without a new snapshot", changed)
	}
	if !p.ReservedForScarce("big") {
		t.Error("the one idle node that can run the 8-GPU 120-core pods is not kept")
	}
	for _, name := range []string{"small-0", "unknown"} {
		if p.ReservedForScarce(name) {
			t.Errorf("node %s kept: no scarce shape fits it", name)
		}
	}
	// 16 cores taken by a pod without GPUs: the scarce shape no longer
	// fits, the node is no longer kept; back when the pod is gone.
	pod := cpuPod("cpu-only", "16")
	fit.Assume(pod, "big")
	if p.ReservedForScarce("big") {
		t.Error("kept with 112 of 128 cores left, where the scarce shape needs 120")
	}
	fit.Forget(pod.UID)
	if !p.ReservedForScarce("big") {
		t.Error("not kept once the pod without GPUs is gone")
	}
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
}
