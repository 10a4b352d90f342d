package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// pruneFixtures are the node kinds of the equivalence test: NVLink meshes,
// NVSwitch boxes, PCIe switch trees, workstations, and a 16-GPU box.
var pruneFixtures = []string{
	"dgx1-v100.txt", "dgx1-p100.txt", "dgx-a100.txt", "dgx-h100.txt",
	"v100-sxm2-8-aliyun-sccgn6.txt", "p40-pcie-7.txt", "pcie-nvbridge-8.txt",
	"pcie-pex-8.txt", "pcie-plx-10.txt", "pcie-switch-8.txt", "pcie-4.txt",
	"workstation-4-nvbridge.txt", "dgx2-16.txt",
}

// pruneCluster is an in-memory cluster of random nodes with random usage.
type pruneCluster struct {
	inv   *inventory
	usage map[string][]allocate.GPUUsage
	ip    *interpreter
	sel   *selectorEvaluator
}

func (pc *pruneCluster) usageOf(n *nodeInventory) []allocate.GPUUsage {
	return slices.Clone(pc.usage[n.Node])
}

func newPruneCluster(t testing.TB, rng *rand.Rand, nodes int, fixtures []string, busy float64) *pruneCluster {
	t.Helper()
	pc := &pruneCluster{inv: newInventory(), usage: map[string][]allocate.GPUUsage{}, sel: newSelectorEvaluator()}
	classes := map[string]*resourceapi.DeviceClass{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	pc.ip = &interpreter{classes: fakeClassLister(classes), cel: pc.sel, inv: pc.inv}
	// Names in an order unrelated to the inventory's, so that the name
	// tie-break is exercised.
	perm := rng.Perm(nodes)
	for i := range nodes {
		topo, err := parseFixture(fixtures[rng.IntN(len(fixtures))])
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
		if err := pc.inv.upsert(s); err != nil {
			t.Fatal(err)
		}
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
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "d", UID: testUID(rng.IntN(1 << 30))},
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

// TestQuickChoiceMatchesExhaustive checks, over random clusters of mixed
// node kinds, random usage, random pods and every packing strategy, that
// the decision taken without planning every node is exactly the one
// planning every node gives: same node, same devices, same shares.
func TestQuickChoiceMatchesExhaustive(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 5000))
	quick, shortcutShapes := 0, 0
	for round := range 12 {
		pc := newPruneCluster(t, rng, 40+rng.IntN(80), pruneFixtures, []float64{0.3, 0.7, 1}[round%3])
		cands := pc.inv.all()
		rng.Shuffle(len(cands), func(i, j int) { cands[i], cands[j] = cands[j], cands[i] })
		for range 25 {
			var pending []*interpretedClaim
			for _, cl := range randomPod(rng) {
				ic, _, err := pc.ip.interpret(ctx, cl)
				if err != nil {
					t.Fatalf("interpret: %v", err)
				}
				pending = append(pending, ic)
			}
			pol := allocate.Policy{
				Node: []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
				GPU:  []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
			}
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, cands, pc.usageOf, pending)
			ref := choosePlan(plans, pol)
			got, ok := quickChoice(ctx, pc.sel, pol, cands, pc.usageOf, pending)
			single := len(pending) == 1 && len(pending[0].Requests) == 1 && len(pending[0].Requests[0].Alternatives) == 1
			if single && ref != nil {
				shortcutShapes++
			}
			if !ok {
				continue
			}
			quick++
			if ref == nil {
				t.Fatalf("round %d: quick choice %s where planning every node finds none", round, got.summarize())
			}
			if g, w := got.summarize(), ref.summarize(); g != w {
				t.Fatalf("round %d, policy %+v: quick choice %s, planning every node %s", round, pol, g, w)
			}
		}
	}
	t.Logf("%d decisions by the shortcut out of %d single-placement pods that fit", quick, shortcutShapes)
	// Shares whose default size differs across nodes fall back; most
	// single-placement pods must take the shortcut or it is not tested.
	if shortcutShapes == 0 || quick*10 < shortcutShapes*7 {
		t.Fatalf("only %d of %d single-placement decisions took the shortcut", quick, shortcutShapes)
	}
}

// TestSampleAlternatives checks the nodes a quick choice names in its
// event: at most three others that fit, and the count of those not
// planned adds up with the ones planned and the chosen one.
func TestSampleAlternatives(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	pc := newPruneCluster(t, rng, 30, []string{"dgx1-v100.txt", "pcie-4.txt"}, 0.5)
	cands := pc.inv.all()
	ic, _, err := pc.ip.interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*interpretedClaim{ic}
	chosen, ok := quickChoice(ctx, pc.sel, allocate.Policy{}, cands, pc.usageOf, pending)
	if !ok {
		t.Fatal("shortcut did not apply")
	}
	plans, why, unexamined := sampleAlternatives(ctx, pc.sel, allocate.Policy{}, cands, pc.usageOf, pending, chosen)
	if plans[0] != chosen || len(plans) > 4 {
		t.Fatalf("want the chosen plan first and at most three others, got %d plans", len(plans))
	}
	for _, pl := range plans[1:] {
		if pl.Node == chosen.Node {
			t.Fatalf("the chosen node %s is named as an alternative", chosen.Node.Node)
		}
	}
	planned := len(plans) - 1
	if planned < 3 && len(why) == 0 {
		t.Fatalf("fewer than three alternatives (%d) and no reason for the others", planned)
	}
	if unexamined <= 0 || unexamined > len(cands)-1-planned {
		t.Fatalf("%d not planned out of %d candidates with %d alternatives planned", unexamined, len(cands), planned)
	}
	if tried := len(cands) - 1 - unexamined; tried > maxSampledAlternatives {
		t.Fatalf("planned %d nodes after the choice, want at most %d", tried, maxSampledAlternatives)
	}
	note := alternativesNote(chosen, plans, why, nil, unexamined)
	if !strings.Contains(note, fmt.Sprintf("%d other nodes not planned", unexamined)) {
		t.Fatalf("note %q does not count the nodes not planned", note)
	}
}
