package planner

import (
	"math"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// The demand mix is weighed by the nodes' scarcity once per snapshot of
// the history: kept scores, keyed by the mix, stay valid until the next.
func TestDemandPolicyWeighsScarcityOncePerSnapshot(t *testing.T) {
	rec, err := newDemandRecorder(true)
	if err != nil {
		t.Fatal(err)
	}
	if pol := rec.policy(allocate.Policy{}, func() []allocate.NodeCapacity {
		t.Fatal("capacities read before any pod was recorded")
		return nil
	}); pol.Demand != nil {
		t.Fatalf("before any pod: Demand = %v, want nil", pol.Demand)
	}
	calls := 0
	capacities := func() []allocate.NodeCapacity {
		calls++
		return []allocate.NodeCapacity{{GPUs: 8, Host: allocate.Host{CPUMilli: 128000, MemoryBytes: 768 << 30}}, {GPUs: 8, Host: allocate.Host{CPUMilli: 96000, MemoryBytes: 384 << 30}}}
	}
	shape := allocate.DemandShape{GPUs: 8, Host: allocate.Host{CPUMilli: 120000, MemoryBytes: 720 << 30}}
	if err := rec.hist.Record(shape); err != nil {
		t.Fatal(err)
	}
	first := rec.policy(allocate.Policy{}, capacities)
	again := rec.policy(allocate.Policy{}, capacities)
	if first.Demand == nil || first.Demand != again.Demand || calls != 1 {
		t.Fatalf("same snapshot: mixes %p and %p, capacities read %d times; want one weighed mix, read once", first.Demand, again.Demand, calls)
	}
	if first.Demand == rec.hist.Mix() {
		t.Fatal("the policy's mix is the history's own, not weighed by scarcity")
	}
	// A refresh whose mix moved (here half the pods ask for one GPU) is a
	// new snapshot; one within HoldDemand's distance keeps the old.
	other := allocate.DemandShape{GPUs: 1, Host: allocate.Host{CPUMilli: 8000, MemoryBytes: 64 << 30}}
	for range demandRefresh {
		if err := rec.hist.Record(other); err != nil {
			t.Fatal(err)
		}
	}
	if next := rec.policy(allocate.Policy{}, capacities); next.Demand == first.Demand || calls != 2 {
		t.Fatalf("after a refresh: mix unchanged (%v) or capacities read %d times, want a new mix, read twice", next.Demand == first.Demand, calls)
	}
}

// capacities: a node's GPUs and allocatable; a node whose allocatable is
// not known fits any pod.
func TestCapacities(t *testing.T) {
	inv := NewInventory()
	topo, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	for p := range topo.GPUs {
		topo.GPUs[p].ProductName = "Tesla V100-SXM2-32GB"
	}
	for _, node := range []string{"a", "b"} {
		s, err := controllertest.Slice(node, topo, controllertest.SliceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	f := &NodeFilter{}
	n := controllertest.Node("a")
	n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("96")
	n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("384Gi")
	f.Allocatable.Set(n)
	// Node a has two GPUs given out whole and a quarter share on a third.
	usage := func(n *NodeInventory) []allocate.GPUUsage {
		u := make([]allocate.GPUUsage, n.Topo.Len())
		if n.Node == "a" {
			u[0].Exclusive, u[1].Exclusive = true, true
			u[2] = allocate.GPUUsage{Shares: 1, Cores: 25, MemoryBytes: n.Topo.GPUs[2].MemoryBytes / 4}
		}
		return u
	}
	got := map[int64]allocate.NodeCapacity{}
	for _, c := range f.capacities(inv.All(), usage) {
		got[c.Host.CPUMilli] = c
	}
	product := "Tesla V100-SXM2-32GB"
	want := map[int64]allocate.NodeCapacity{
		96000:         {GPUs: 8, Host: allocate.Host{CPUMilli: 96000, MemoryBytes: 384 << 30}, Product: product, AllocatedMilli: 2250},
		math.MaxInt64: {GPUs: 8, Host: allocate.Host{CPUMilli: math.MaxInt64, MemoryBytes: math.MaxInt64}, Product: product},
	}
	if len(got) != 2 || got[96000] != want[96000] || got[math.MaxInt64] != want[math.MaxInt64] {
		t.Fatalf("capacities = %+v, want %+v", got, want)
	}
}
