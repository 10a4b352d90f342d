package planner

import (
	"context"
	"math/rand/v2"
	"slices"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// TestRankIndexMatchesExhaustive checks the ranked index of each request
// shape (rankIndex) over long sequences of decisions with a few shapes, as
// a controller sees them: each decision over the inventory's list is the
// one planning every admitted node gives, and the one ranking every node
// by its kept score gives (same verdict too), while plans are committed
// and released, nodes' CPU and memory change, device taints replace
// nodes, and the size mix and the demand mix move (the nodes that did not
// change then ranked from their kept stranding basis). Most decisions must
// take the index's incremental path (only the changed nodes rescored), or
// it is not what is tested. Node kinds include a 32-GPU node, whose
// whole-GPU scores depend on the size mix.
func TestRankIndexMatchesExhaustive(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 5000))
	fixtures := append(slices.Clone(pruneFixtures), "synthetic-32.txt")
	claim := func(reqs []resourceapi.DeviceRequest, cfg ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d", UID: controllertest.UID(rng.IntN(1 << 30))},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs, Config: cfg}}}
	}
	shapes := []*resourceapi.ResourceClaim{
		claim([]resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}),
		claim([]resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}),
		claim([]resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}),
		claim([]resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}),
		// Only a 16- or 32-GPU node holds it: often none is free.
		claim([]resourceapi.DeviceRequest{controllertest.WholeRequest("g", 16)}),
		claim([]resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}, controllertest.RequiredNVLinkConfig("g")),
		claim([]resourceapi.DeviceRequest{controllertest.ShareRequest("s", "4Gi", "25")}),
		claim([]resourceapi.DeviceRequest{controllertest.ShareRequest("s", "12Gi", "50")}),
	}
	podHosts := []allocate.Host{{}, {CPUMilli: 4_000, MemoryBytes: 16 << 30}}
	var decided, noFit, unsure, incremental, restranded, built int
	for round := range 5 {
		pc := newPruneCluster(t, rng, 60+rng.IntN(60), fixtures, []float64{0.3, 0.7}[round%2])
		var pending [][]*Claim
		for _, cl := range shapes {
			ic, _, err := pc.ip.Interpret(ctx, cl)
			if err != nil {
				t.Fatalf("interpret: %v", err)
			}
			pending = append(pending, []*Claim{ic})
		}
		pol := allocate.Policy{
			Node: []allocate.Strategy{allocate.Binpack, allocate.Spread}[round/2%2],
			GPU:  []allocate.Strategy{allocate.Binpack, allocate.Spread}[round%2],
		}
		// Rounds 0, 2 and 4 rank by stranded GPU.
		ranking := round != 1 && round != 3
		hosts := map[string]*allocate.Host{}
		for _, n := range pc.inv.All() {
			hosts[n.Node] = &allocate.Host{CPUMilli: int64(8_000 + rng.IntN(56_000)), MemoryBytes: int64(32+rng.IntN(224)) << 30}
		}
		demand, err := allocate.NewDemandHistory(128, 64)
		if err != nil {
			t.Fatal(err)
		}
		sizes, err := allocate.NewSizeHistory(64, 16)
		if err != nil {
			t.Fatal(err)
		}
		var heldDemand *allocate.DemandMix
		var heldSize *allocate.SizeMix
		indexedCache, keptCache := newScoreCache(), newScoreCache()
		type placed struct {
			node  string
			usage []allocate.GPUUsage
		}
		var live []placed
		for step := range 400 {
			nodes := pc.inv.All()
			switch x := rng.IntN(120); {
			case x == 0:
				pc.taintFirstDevice(t, nodes[rng.IntN(len(nodes))].Node)
				nodes = pc.inv.All()
			case x < 12 && ranking:
				// Pods without GPUs come and go on some node.
				n := nodes[rng.IntN(len(nodes))]
				hosts[n.Node].CPUMilli = int64(rng.IntN(64_000))
				pc.touch(n.Node)
			}
			if len(live) > 30 || (len(live) > 0 && rng.IntN(4) == 0) {
				i := rng.IntN(len(live))
				pc.setUsage(live[i].node, live[i].usage)
				live = slices.Delete(live, i, i+1)
			}
			// The workload changes every 100 pods (to small pods and back),
			// which moves the size and demand mixes.
			k := rng.IntN(len(shapes))
			if step/100%2 == 1 {
				k = rng.IntN(3)
			}
			p := pol
			if a := pending[k][0].Requests[0].Alternatives[0]; !a.Share {
				sizes.Record(a.Count)
			}
			heldSize = allocate.HoldSize(heldSize, sizes.Mix())
			p.Mix = heldSize
			var rank *hostRanking
			if ranking {
				heldDemand = allocate.HoldDemand(heldDemand, demand.Mix())
				p.Demand = heldDemand
				rank = &hostRanking{left: func(n string) *allocate.Host { return hosts[n] }, pod: podHosts[step%len(podHosts)]}
			}
			// The fit filter turns down the nodes short of the pod's CPU
			// or memory, from the same counts.
			admit := func(n *NodeInventory) bool {
				h := hosts[n.Node]
				return rank == nil || (rank.pod.CPUMilli <= h.CPUMilli && rank.pod.MemoryBytes <= h.MemoryBytes)
			}
			var cands []*NodeInventory
			for _, n := range nodes {
				if admit(n) {
					cands = append(cands, n)
				}
			}
			plans, _, _ := exhaustivePlans(ctx, pc.sel, p, cands, pc.NodeUsage, pending[k])
			ref := choosePlan(plans, p, rank)

			indexedCache.inventory(nodes)
			before := Ranking()
			got, verdict := quickChoice(ctx, pc.sel, p, nodes, pc, indexedCache, admit, pending[k], rank)
			after := Ranking()
			incremental += int(after.IncrementalSyncs - before.IncrementalSyncs)
			restranded += int(after.Restranded - before.Restranded)
			built += int(after.built() - before.built())
			kept, keptVerdict := quickChoice(ctx, pc.sel, p, nodes, pc, keptCache, admit, pending[k], rank)
			if verdict != keptVerdict {
				t.Fatalf("round %d, step %d: verdict %d with the index, %d ranking every node", round, step, verdict, keptVerdict)
			}
			switch verdict {
			case quickChosen:
				decided++
				if ref == nil {
					t.Fatalf("round %d, step %d: index chose %s where planning every node finds none", round, step, got.plan.Summarize())
				}
				if g, w, r := got.plan.Summarize(), kept.plan.Summarize(), ref.Summarize(); g != r || w != r {
					t.Fatalf("round %d, step %d, policy %+v: index %s, ranking every node %s, planning every node %s", round, step, p, g, w, r)
				}
			case quickNoFit:
				noFit++
				if ref != nil {
					t.Fatalf("round %d, step %d: index found nothing fits, planning every node gives %s", round, step, ref.Summarize())
				}
			default:
				unsure++
			}
			if ref == nil {
				continue
			}
			live = append(live, placed{ref.Node.Node, slices.Clone(pc.usage[ref.Node.Node])})
			pc.commit(ref)
			if ranking {
				h := hosts[ref.Node.Node]
				h.CPUMilli -= rank.pod.CPUMilli
				h.MemoryBytes -= rank.pod.MemoryBytes
				pc.touch(ref.Node.Node)
				rec := &demandRecorder{hist: demand}
				rec.record(ctx, podAsking(rank.pod), ref)
			}
		}
	}
	t.Logf("%d decisions, %d found to fit nowhere, %d unsure; the index synced incrementally %d times (%d under a new demand mix), was built %d times", decided, noFit, unsure, incremental, restranded, built)
	if decided < 1000 || incremental < 3*built || noFit == 0 || restranded < 20 {
		t.Fatalf("%d decisions (want 1000), %d incremental syncs (%d under a new demand mix) against %d builds, %d found to fit nowhere: the index's paths are not tested", decided, incremental, restranded, built, noFit)
	}
}

// TestRankWalkOrder checks that reading the index best first gives every
// fitting node in the order popping a heap of them gives, after entries
// moved in and out of the ranking.
func TestRankWalkOrder(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(2, 3))
	pc := newPruneCluster(t, rng, 200, pruneFixtures, 0.7)
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*Claim{ic}
	nodes := pc.inv.All()
	cache := newScoreCache()
	cache.inventory(nodes)
	for step := range 20 {
		for range 10 {
			n := nodes[rng.IntN(len(nodes))]
			u := make([]allocate.GPUUsage, len(n.Devices))
			for g := range u {
				if rng.IntN(2) == 0 {
					u[g] = allocate.GPUUsage{Exclusive: true}
				}
			}
			pc.setUsage(n.Node, u)
		}
		q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil)
		if verdict != quickChosen {
			t.Fatalf("step %d: verdict %d", step, verdict)
		}
		got := []string{q.plan.Node.Node}
		for q.rest.Len() > 0 {
			got = append(got, q.rest.next().Node)
		}
		h, ok := rankAll(ctx, pc.sel, allocate.Policy{}, nodes, pc, newScoreCache().shape("x", len(nodes)), ic.Requests[0].Alternatives[0], quickSignature(ic.Requests[0].Alternatives[0]), nil)
		if !ok {
			t.Fatal("ranking every node is unsure")
		}
		var want []string
		for h.Len() > 0 {
			want = append(want, h.next().Node)
		}
		if !slices.Equal(got, want) {
			t.Fatalf("step %d: index order %v, heap order %v", step, got, want)
		}
	}
}

// TestUsageLog checks the change log's bound: changes are returned in
// order while kept, and a caller further behind is told to read every
// node's generation.
func TestUsageLog(t *testing.T) {
	var l usageLog
	l.add("a")
	l.add("b")
	got, now, ok := l.since(0, nil)
	if !ok || now != 2 || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("since 0: %v %d %v", got, now, ok)
	}
	if got, now, ok = l.since(2, nil); !ok || now != 2 || len(got) != 0 {
		t.Fatalf("since 2: %v %d %v", got, now, ok)
	}
	for range usageLogSize {
		l.add("c")
	}
	if _, _, ok = l.since(1, nil); ok {
		t.Fatal("since 1 after the log wrapped: want not ok")
	}
	if got, _, ok = l.since(2, nil); !ok || len(got) != usageLogSize || got[0] != "c" {
		t.Fatalf("since 2, just kept: %d changes, ok %v", len(got), ok)
	}
}
