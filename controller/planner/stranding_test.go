package planner

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

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
	if pol := rec.policy(allocate.Policy{}, func() []*allocate.NodeState {
		t.Fatal("nodes read before any pod was recorded")
		return nil
	}); pol.Demand != nil {
		t.Fatalf("before any pod: Demand = %v, want nil", pol.Demand)
	}
	topo, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	nodesNow := func() []*allocate.NodeState {
		calls++
		return []*allocate.NodeState{
			{Name: "large", Topology: topo, Usage: make([]allocate.GPUUsage, 8), Host: &allocate.Host{CPUMilli: 128000, MemoryBytes: 768 << 30}},
			{Name: "common", Topology: topo, Usage: make([]allocate.GPUUsage, 8), Host: &allocate.Host{CPUMilli: 96000, MemoryBytes: 384 << 30}},
		}
	}
	shape := allocate.DemandShape{GPUs: 8, Host: allocate.Host{CPUMilli: 120000, MemoryBytes: 720 << 30}}
	if err := rec.hist.Record(shape); err != nil {
		t.Fatal(err)
	}
	first := rec.policy(allocate.Policy{}, nodesNow)
	again := rec.policy(allocate.Policy{}, nodesNow)
	if first.Demand == nil || first.Demand != again.Demand || calls != 1 {
		t.Fatalf("same snapshot: mixes %p and %p, nodes read %d times; want one weighed mix, read once", first.Demand, again.Demand, calls)
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
	if next := rec.policy(allocate.Policy{}, nodesNow); next.Demand == first.Demand || calls != 2 {
		t.Fatalf("after a refresh: mix unchanged (%v) or nodes read %d times, want a new mix, read twice", next.Demand == first.Demand, calls)
	}
}

// nodesNow: each GPU node with the ledger's usage and its CPU and memory
// left for pods; a node whose allocatable is not known fits any pod.
func TestNodesNow(t *testing.T) {
	inv := NewInventory()
	topo, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"a", "b"} {
		s, err := controllertest.Slice(node, topo, controllertest.SliceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if node == "b" {
			// A health taint: no pod can be given b's GPU 3.
			s.Spec.Devices[3].Taints = append(s.Spec.Devices[3].Taints, resourceapi.DeviceTaint{Key: "gpu.gpulink.dev/unhealthy", Effect: resourceapi.DeviceTaintEffectNoExecute})
		}
		if err := inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
	}
	f := &NodeFilter{Fit: NewFitTracker()}
	n := controllertest.Node("a")
	n.Status.Allocatable[corev1.ResourceCPU] = resource.MustParse("96")
	n.Status.Allocatable[corev1.ResourceMemory] = resource.MustParse("384Gi")
	f.Allocatable.Set(n)
	f.Fit.Observe(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "cpu-pod", UID: "cpu-pod"},
		Spec: corev1.PodSpec{NodeName: "a", Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("10"), corev1.ResourceMemory: resource.MustParse("64Gi")}}}}}})
	// Node a has two GPUs given out whole and a quarter share on a third.
	usage := func(n *NodeInventory) []allocate.GPUUsage {
		u := make([]allocate.GPUUsage, n.Topo.Len())
		if n.Node == "a" {
			u[0].Exclusive, u[1].Exclusive = true, true
			u[2] = allocate.GPUUsage{Shares: 1, Cores: 25, MemoryBytes: n.Topo.GPUs[2].MemoryBytes / 4}
		}
		return u
	}
	got := map[string]*allocate.NodeState{}
	for _, s := range f.nodesNow(inv.All(), usage) {
		got[s.Name] = s
	}
	if len(got) != 2 || got["a"] == nil || got["b"] == nil {
		t.Fatalf("nodesNow = %v, want nodes a and b", got)
	}
	if a := got["a"]; a.Topology.Len() != 8 || !a.Usage[0].Exclusive || !a.Usage[1].Exclusive || a.Usage[2].Shares != 1 ||
		a.Host == nil || *a.Host != (allocate.Host{CPUMilli: 86000, MemoryBytes: 320 << 30}) {
		t.Errorf("node a = %+v (host %+v), want its usage and 86 CPUs, 320Gi left", a, a.Host)
	}
	if b := got["b"]; b.Host != nil || b.Usage[0].Exclusive || !b.Usage[3].Exclusive {
		t.Errorf("node b = %+v, want no host (allocatable unknown), GPU 0 idle and the tainted GPU 3 taken", b)
	}
}

// unavailableAsTaken: a GPU no pod can be given (not published, or
// tainted NoSchedule or NoExecute against pods without a toleration) is
// no supply for the scarcity weighing; the usage given is never changed.
func TestUnavailableAsTaken(t *testing.T) {
	noSchedule := resourceapi.DeviceTaint{Key: "example.com/broken", Effect: resourceapi.DeviceTaintEffectNoSchedule}
	noExecute := resourceapi.DeviceTaint{Key: "gpu.gpulink.dev/unhealthy", Effect: resourceapi.DeviceTaintEffectNoExecute}
	shared := allocate.GPUUsage{Shares: 1, Cores: 25, MemoryBytes: 4 << 30}
	for _, tc := range []struct {
		name        string
		taints      map[int]resourceapi.DeviceTaint
		unpublished int // position whose device is missing; -1: none
		usage       []allocate.GPUUsage
		wantTaken   []bool
	}{
		{"only gpulink's managed taint", nil, -1, make([]allocate.GPUUsage, 4), []bool{false, false, false, false}},
		{"NoSchedule on an idle GPU", map[int]resourceapi.DeviceTaint{1: noSchedule}, -1, make([]allocate.GPUUsage, 4), []bool{false, true, false, false}},
		{"NoExecute on a shared GPU", map[int]resourceapi.DeviceTaint{2: noExecute}, -1, []allocate.GPUUsage{{}, {}, shared, {}}, []bool{false, false, true, false}},
		{"a GPU given out whole stays so", map[int]resourceapi.DeviceTaint{0: noSchedule}, -1, []allocate.GPUUsage{{Exclusive: true}, {}, {}, {}}, []bool{true, false, false, false}},
		{"a device not published", nil, 3, make([]allocate.GPUUsage, 4), []bool{false, false, false, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n := idleNode(t, tc.taints)
			if tc.unpublished >= 0 {
				devices := slices.Clone(n.Devices)
				devices[tc.unpublished] = nil
				n = &NodeInventory{Node: n.Node, Topo: n.Topo, Devices: devices, unavailable: unavailableGPUs(devices)}
			}
			before := slices.Clone(tc.usage)
			got := unavailableAsTaken(n, tc.usage)
			if !slices.Equal(tc.usage, before) {
				t.Errorf("usage given changed to %+v, was %+v", tc.usage, before)
			}
			for p, want := range tc.wantTaken {
				if got[p].Exclusive != want {
					t.Errorf("GPU %d taken = %v, want %v (usage %+v)", p, got[p].Exclusive, want, got)
				}
				if !want && got[p] != tc.usage[p] {
					t.Errorf("GPU %d usage = %+v, want %+v as given", p, got[p], tc.usage[p])
				}
			}
		})
	}
}
