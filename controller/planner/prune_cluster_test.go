package planner

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// The random clusters and pods of the choice tests and the 5,000-node
// benchmarks.

// pruneFixtures are the node kinds of the equivalence test: NVLink meshes,
// NVSwitch boxes, PCIe switch trees, workstations, and a 16-GPU box.
var pruneFixtures = []string{
	"dgx1-v100.txt", "dgx1-p100.txt", "dgx-a100.txt", "dgx-h100.txt",
	"v100-sxm2-8-aliyun-sccgn6.txt", "p40-pcie-7.txt", "pcie-nvbridge-8.txt",
	"pcie-pex-8.txt", "pcie-plx-10.txt", "pcie-switch-8.txt", "pcie-4.txt",
	"workstation-4-nvbridge.txt", "dgx2-16.txt",
}

// pruneCluster is an in-memory cluster of random nodes with random usage.
// It is its own usageSource: gen counts each node's usage changes.
type pruneCluster struct {
	inv    *Inventory
	slices map[string]*resourceapi.ResourceSlice
	usage  map[string][]allocate.GPUUsage
	gen    map[string]uint64
	log    usageLog
	ip     *Interpreter
	sel    *SelectorEvaluator
}

func (pc *pruneCluster) NodeUsage(n *NodeInventory) []allocate.GPUUsage {
	return slices.Clone(pc.usage[n.Node])
}

func (pc *pruneCluster) Generations(nodes []*NodeInventory, out []uint64) uint64 {
	for i, n := range nodes {
		out[i] = pc.gen[n.Node]
	}
	return pc.log.seq
}

func (pc *pruneCluster) Changes(since uint64, out []string) ([]string, uint64, bool) {
	return pc.log.since(since, out)
}

// setUsage changes a node's usage, as the ledger does when a claim is
// allocated or released.
func (pc *pruneCluster) setUsage(node string, u []allocate.GPUUsage) {
	pc.usage[node] = u
	pc.touch(node)
}

// touch moves a node's generation, as the ledger does when its usage or
// its CPU and memory left change. Pools are named after their nodes.
func (pc *pruneCluster) touch(node string) {
	pc.gen[node]++
	pc.log.add(node)
}

// commit adds a plan's devices to its node's usage.
func (pc *pruneCluster) commit(pl *Plan) {
	u := slices.Clone(pc.usage[pl.Node.Node])
	for _, claim := range pl.Claims {
		for _, r := range claim {
			for _, pos := range r.Positions {
				if r.Share == nil {
					u[pos] = allocate.GPUUsage{Exclusive: true}
					continue
				}
				u[pos].Shares++
				u[pos].MemoryBytes += r.Share.MemoryBytes
				u[pos].Cores += r.Share.Cores
			}
		}
	}
	pc.setUsage(pl.Node.Node, u)
}

// taintFirstDevice republishes a node's slice with a NoSchedule taint on
// its first device, which replaces the node's inventory.
func (pc *pruneCluster) taintFirstDevice(t testing.TB, node string) {
	t.Helper()
	s := pc.slices[node].DeepCopy()
	s.Spec.Devices[0].Taints = append(s.Spec.Devices[0].Taints, resourceapi.DeviceTaint{Key: "example.com/broken", Effect: resourceapi.DeviceTaintEffectNoSchedule})
	if err := pc.inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
	pc.slices[node] = s
}

func admitAll(*NodeInventory) bool { return true }

func newPruneCluster(t testing.TB, rng *rand.Rand, nodes int, fixtures []string, busy float64) *pruneCluster {
	t.Helper()
	pc := &pruneCluster{inv: NewInventory(), slices: map[string]*resourceapi.ResourceSlice{}, usage: map[string][]allocate.GPUUsage{}, gen: map[string]uint64{}, sel: NewSelectorEvaluator()}
	classes := map[string]*resourceapi.DeviceClass{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	pc.ip = NewInterpreter(controllertest.ClassLister(classes), pc.sel, pc.inv)
	// Names in an order unrelated to the inventory's, so that the name
	// tie-break is exercised.
	perm := rng.Perm(nodes)
	for i := range nodes {
		topo, err := controllertest.ParseFixture(fixtures[rng.IntN(len(fixtures))])
		if err != nil {
			t.Fatal(err)
		}
		opts := controllertest.SliceOptions{}
		if rng.IntN(8) == 0 {
			// A few nodes with other share defaults, so that default-size
			// shares differ across nodes.
			opts.DefaultShareMemory = 8 << 30
		}
		name := fmt.Sprintf("node-%05d", perm[i])
		s, err := controllertest.Slice(name, topo, opts)
		if err != nil {
			t.Fatal(err)
		}
		if err := pc.inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
		pc.slices[name] = s
		u := make([]allocate.GPUUsage, len(topo.GPUs))
		// Some nodes idle: identical idle nodes tie on everything but name.
		if rng.Float64() < busy {
			for g := range u {
				switch x := rng.Float64(); {
				case x < 0.3:
					u[g] = allocate.GPUUsage{Exclusive: true}
				case x < 0.5:
					sh := 1 + rng.IntN(3)
					u[g] = allocate.GPUUsage{Shares: sh, MemoryBytes: int64(sh) * int64(1+rng.IntN(6)) << 30, Cores: int64(sh * (5 + rng.IntN(25)))}
				}
			}
		}
		pc.usage[name] = u
	}
	return pc
}

// randomPod returns the claims of a random pod: whole GPUs with or without
// a required link, shares of fixed or default size, several requests or
// claims, firstAvailable.
func randomPod(rng *rand.Rand) []*resourceapi.ResourceClaim {
	claim := func(name string, reqs []resourceapi.DeviceRequest, cfg ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "d", UID: controllertest.UID(rng.IntN(1 << 30))},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs, Config: cfg}}}
	}
	sizes := []int64{1, 1, 1, 2, 2, 2, 3, 4, 4, 4, 5, 6, 8, 8}
	switch rng.IntN(10) {
	case 0, 1, 2, 3:
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{controllertest.WholeRequest("g", sizes[rng.IntN(len(sizes))])})}
	case 4, 5:
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2+rng.Int64N(7))},
			controllertest.RequiredNVLinkConfig("g"))}
	case 6:
		mem := []string{"", "2Gi", "8Gi", "20Gi"}[rng.IntN(4)]
		cores := []string{"", "20", "50"}[rng.IntN(3)]
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{controllertest.ShareRequest("s", mem, cores)})}
	case 7:
		return []*resourceapi.ResourceClaim{
			claim("a", []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1+rng.Int64N(4))}),
			claim("b", []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "4Gi", "")}),
		}
	case 8:
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{
			controllertest.WholeRequest("g", 1+rng.Int64N(4)), controllertest.WholeRequest("h", 1+rng.Int64N(2))})}
	default:
		big := controllertest.WholeRequest("x", 8)
		small := controllertest.WholeRequest("y", 2+rng.Int64N(3))
		return []*resourceapi.ResourceClaim{claim("c", []resourceapi.DeviceRequest{{Name: "g", FirstAvailable: []resourceapi.DeviceSubRequest{
			{Name: "big", DeviceClassName: big.Exactly.DeviceClassName, AllocationMode: big.Exactly.AllocationMode, Count: big.Exactly.Count},
			{Name: "small", DeviceClassName: small.Exactly.DeviceClassName, AllocationMode: small.Exactly.AllocationMode, Count: small.Exactly.Count},
		}}})}
	}
}

// podAsking is a pod whose one container requests host's CPU and memory.
func podAsking(host allocate.Host) *corev1.Pod {
	return &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{
		corev1.ResourceCPU:    *resource.NewMilliQuantity(host.CPUMilli, resource.DecimalSI),
		corev1.ResourceMemory: *resource.NewQuantity(host.MemoryBytes, resource.BinarySI),
	}}}}}}
}
