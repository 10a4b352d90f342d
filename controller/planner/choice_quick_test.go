package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// TestQuickChoiceMatchesExhaustive checks, over random clusters of mixed
// node kinds, random usage, random pods, random node filters and every
// packing strategy, that the decision taken without planning every node is
// exactly the one planning every admitted node gives: same node, same
// devices, same shares. Each round keeps one score cache over a sequence
// of decisions whose plans are committed, with nodes freed and device
// taints added in between, so that cached scores must follow usage and
// inventory changes.
func TestQuickChoiceMatchesExhaustive(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(9, 5000))
	quick, shortcutShapes, cached, noFit, bounded, indexed := 0, 0, 0, 0, 0, 0
	podHosts := []allocate.Host{{}, {CPUMilli: 2_000, MemoryBytes: 8 << 30}, {CPUMilli: 6_000, MemoryBytes: 24 << 30}}
	for round := range 12 {
		pc := newPruneCluster(t, rng, 40+rng.IntN(80), pruneFixtures, []float64{0.3, 0.7, 1}[round%3])
		cache := newScoreCache()
		// Rounds 4-11 order ties by topology tie keys that do not follow
		// the names, as the controller's do on a cluster whose node names
		// say nothing of its leaves, and move nodes between leaves below.
		leafKey := func(name string) string {
			return allocate.TopologyTieKey([]string{fmt.Sprintf("leaf-%d", rng.IntN(3)), fmt.Sprintf("spine-%d", rng.IntN(2))}, name)
		}
		if round >= 4 {
			for _, n := range pc.inv.All() {
				pc.inv.SetTieKey(n.Node, leafKey(n.Node))
			}
		}
		// Odd rounds rank by stranded GPU: each node has CPU and memory
		// left (changing as pods are placed), the pods ask for some, and
		// a demand mix of recent shapes weighs the stranding.
		var rank *hostRanking
		var demand *allocate.DemandHistory
		hosts := map[string]*allocate.Host{}
		if round%2 == 1 {
			var err error
			if demand, err = allocate.NewDemandHistory(64, 8); err != nil {
				t.Fatal(err)
			}
			for _, n := range pc.inv.All() {
				hosts[n.Node] = &allocate.Host{CPUMilli: int64(rng.IntN(24_000)), MemoryBytes: int64(rng.IntN(96)) << 30}
			}
		}
		for range 40 {
			nodes := pc.inv.All()
			switch rng.IntN(8) {
			case 0:
				n := nodes[rng.IntN(len(nodes))]
				pc.setUsage(n.Node, make([]allocate.GPUUsage, len(n.Devices)))
			case 1:
				pc.taintFirstDevice(t, nodes[rng.IntN(len(nodes))].Node)
				nodes = pc.inv.All()
			case 2:
				if round >= 4 {
					name := nodes[rng.IntN(len(nodes))].Node
					pc.inv.SetTieKey(name, leafKey(name))
					nodes = pc.inv.All()
				}
			}
			var pending []*Claim
			for _, cl := range randomPod(rng) {
				ic, _, err := pc.ip.Interpret(ctx, cl)
				if err != nil {
					t.Fatalf("interpret: %v", err)
				}
				pending = append(pending, ic)
			}
			pol := allocate.Policy{
				Node: []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
				GPU:  []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
			}
			if demand != nil {
				// Pods without GPUs come and go: CPU and memory change on
				// nodes whose GPU usage does not.
				// A change of a node's CPU or memory left moves its
				// generation, as the controller's ledger.Touch does.
				for range 1 + rng.IntN(len(nodes)/4+1) {
					n := nodes[rng.IntN(len(nodes))]
					hosts[n.Node] = &allocate.Host{CPUMilli: int64(rng.IntN(24_000)), MemoryBytes: int64(rng.IntN(96)) << 30}
					pc.touch(n.Node)
				}
				// Pods of a few sizes, so that scores are kept for each
				// between decisions.
				rank = &hostRanking{left: func(n string) *allocate.Host { return hosts[n] },
					pod: podHosts[rng.IntN(len(podHosts))]}
				pol.Demand = demand.Mix()
			}
			// A pod filter that turns down some nodes, as node fit does
			// (and, ranking by stranding, the nodes short of the pod's CPU
			// or memory, as the fit filter does from the same counts).
			rejected := map[string]bool{}
			var cands []*NodeInventory
			for _, n := range nodes {
				short := rank != nil && (hosts[n.Node].CPUMilli < rank.pod.CPUMilli || hosts[n.Node].MemoryBytes < rank.pod.MemoryBytes)
				if rng.IntN(5) == 0 || short {
					rejected[n.Node] = true
				} else {
					cands = append(cands, n)
				}
			}
			admit := func(n *NodeInventory) bool { return !rejected[n.Node] }
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, cands, pc.NodeUsage, pending)
			ref := choosePlan(plans, pol, rank)
			before := cache.entries()
			// Most decisions over the inventory's list, ranked by each
			// shape's index, the others by its scores kept per node (a
			// decision restricted to some nodes): the index catches up
			// with the changes in between.
			if rng.IntN(4) != 0 {
				cache.inventory(nodes)
				indexed++
			} else {
				cache.inventory(nil)
			}
			got, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admit, pending, rank)
			ok := verdict == quickChosen
			if verdict == quickNoFit {
				noFit++
				if ref != nil {
					t.Fatalf("round %d, policy %+v: the shortcut found nothing fits, planning every node gives %s", round, pol, ref.Summarize())
				}
			}
			single := len(pending) == 1 && len(pending[0].Requests) == 1 && len(pending[0].Requests[0].Alternatives) == 1
			if single && ref != nil {
				shortcutShapes++
			}
			if ok {
				quick++
				if before > 0 {
					cached++
				}
				if ref == nil {
					t.Fatalf("round %d: quick choice %s where planning every node finds none", round, got.plan.Summarize())
				}
				if g, w := got.plan.Summarize(), ref.Summarize(); g != w {
					t.Fatalf("round %d, policy %+v: quick choice %s, planning every node %s", round, pol, g, w)
				}
			}
			if verdict == quickUnsure && rank == nil {
				// Several placements: branch and bound must agree too.
				bp, bv := boundChoice(ctx, pc.sel, pol, nodes, pc, cache, admit, pending)
				switch bv {
				case quickChosen:
					bounded++
					if ref == nil {
						t.Fatalf("round %d: bound choice %s where planning every node finds none", round, bp.Summarize())
					}
					if g, w := bp.Summarize(), ref.Summarize(); g != w {
						t.Fatalf("round %d, policy %+v: bound choice %s, planning every node %s", round, pol, g, w)
					}
				case quickNoFit:
					if ref != nil {
						t.Fatalf("round %d, policy %+v: branch and bound found nothing fits, planning every node gives %s", round, pol, ref.Summarize())
					}
				}
			}
			if ref != nil {
				pc.commit(ref)
				if demand != nil {
					// The pod's CPU and memory are taken on its node, its
					// shape joins the mix, as the controller records it.
					h := hosts[ref.Node.Node]
					h.CPUMilli -= rank.pod.CPUMilli
					h.MemoryBytes -= rank.pod.MemoryBytes
					pc.touch(ref.Node.Node)
					rec := &demandRecorder{hist: demand}
					rec.record(ctx, podAsking(rank.pod), ref)
				}
			}
		}
	}
	t.Logf("%d decisions by the shortcut (%d with scores kept from earlier decisions) out of %d single-placement pods that fit; %d found to fit nowhere; %d pods with several placements by branch and bound; %d decisions over the inventory's list", quick, cached, shortcutShapes, noFit, bounded, indexed)
	// Shares whose default size differs across nodes fall back; most
	// single-placement pods must take the shortcut or it is not tested.
	if shortcutShapes == 0 || quick*10 < shortcutShapes*7 || cached*2 < quick || noFit == 0 || bounded < 20 {
		t.Fatalf("only %d of %d single-placement decisions took the shortcut, %d of them with kept scores, %d found nothing fits; %d by branch and bound", quick, shortcutShapes, cached, noFit, bounded)
	}
}

// TestScoreCacheFollowsUsage checks that a kept score is not used once the
// node's usage generation moved: a node that was best is filled and the
// next decision goes elsewhere, and a freed node is seen free again.
func TestScoreCacheFollowsUsage(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(3, 4))
	pc := newPruneCluster(t, rng, 20, []string{"dgx-a100.txt"}, 0)
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*Claim{ic}
	cache := newScoreCache()
	nodes := pc.inv.All()
	seen := map[string]bool{}
	for i := range len(nodes) {
		q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil)
		if verdict != quickChosen {
			t.Fatalf("decision %d: shortcut did not apply", i)
		}
		name := q.plan.Node.Node
		if seen[name] {
			t.Fatalf("decision %d: node %s chosen again although it is full", i, name)
		}
		seen[name] = true
		pc.commit(q.plan)
	}
	if _, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil); verdict != quickNoFit {
		t.Fatalf("a full cluster: verdict %d, want nothing fits", verdict)
	}
	freed := nodes[7].Node
	pc.setUsage(freed, make([]allocate.GPUUsage, 8))
	q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil)
	if verdict != quickChosen || q.plan.Node.Node != freed {
		t.Fatalf("after freeing %s: got %v, verdict %d", freed, q, verdict)
	}
	// Generations are the contract: a usage change the cache was not told
	// of leaves the kept score, but planning reads the real usage, so the
	// shortcut gives up rather than return a plan that does not fit.
	pc.usage[freed][0] = allocate.GPUUsage{Exclusive: true}
	if q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, cache, admitAll, pending, nil); verdict != quickUnsure {
		t.Fatalf("verdict %d (%v) on %s, whose usage no longer fits: want the shortcut to give up", verdict, q, freed)
	}
}

// TestSampleAlternatives checks the nodes a quick choice names in its
// event: at most three others that fit, in rank order, and the count of
// those not planned adds up with the ones planned and the chosen one.
func TestSampleAlternatives(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 2))
	pc := newPruneCluster(t, rng, 30, []string{"dgx1-v100.txt", "pcie-4.txt"}, 0.5)
	nodes := pc.inv.All()
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*Claim{ic}
	admitted := 0
	admit := func(n *NodeInventory) bool {
		admitted++
		return n.Node != nodes[3].Node
	}
	q, verdict := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, nil, admit, pending, nil)
	if verdict != quickChosen {
		t.Fatal("shortcut did not apply")
	}
	fitting := admitted + q.rest.Len()
	plans, why, unexamined := q.alternatives(ctx, pc.sel, allocate.Policy{}, pc, admit, pending)
	if plans[0] != q.plan || len(plans) != 4 {
		t.Fatalf("want the chosen plan first and three others, got %d plans", len(plans))
	}
	if len(why) != 0 {
		t.Fatalf("nodes ranked as fitting did not fit: %v", why)
	}
	// The alternatives are the next-best nodes: planning every node and
	// ranking without the chosen one gives the first of them.
	var others []*NodeInventory
	for _, n := range nodes {
		if n != q.plan.Node && n.Node != nodes[3].Node {
			others = append(others, n)
		}
	}
	ref, _, _ := exhaustivePlans(ctx, pc.sel, allocate.Policy{}, others, pc.NodeUsage, pending)
	if next := choosePlan(ref, allocate.Policy{}, nil); next == nil || next.Node != plans[1].Node {
		t.Fatalf("first alternative %s, want the next-best node", plans[1].Node.Node)
	}
	for _, pl := range plans[1:] {
		if pl.Node == q.plan.Node || pl.Node.Node == nodes[3].Node {
			t.Fatalf("node %s named as an alternative", pl.Node.Node)
		}
	}
	// Every node that fits was either looked at (admit) or is counted as
	// not planned.
	if unexamined != fitting-admitted || unexamined == 0 {
		t.Fatalf("%d not planned out of %d fitting nodes with %d looked at", unexamined, fitting, admitted)
	}
	note := AlternativesNote(q.plan, plans, why, nil, unexamined)
	if !strings.Contains(note, fmt.Sprintf("%d other nodes not planned", unexamined)) {
		t.Fatalf("note %q does not count the nodes not planned", note)
	}
}

// TestBoundChoiceMatchesExhaustive checks branch and bound alone on many
// pods with several placements (several claims, several requests, shares
// of several GPUs) over small clusters where many nodes tie, so that a
// bound a little off shows as a different node.
func TestBoundChoiceMatchesExhaustive(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(17, 23))
	decided, none := 0, 0
	for round := range 150 {
		pc := newPruneCluster(t, rng, 6+rng.IntN(20), []string{"dgx1-v100.txt", "dgx-a100.txt", "pcie-nvbridge-8.txt", "pcie-4.txt", "dgx2-16.txt"}, []float64{0, 0.5, 1}[round%3])
		cache := newScoreCache()
		for range 30 {
			nodes := pc.inv.All()
			var pending []*Claim
			for {
				pending = pending[:0]
				for _, cl := range randomPod(rng) {
					ic, _, err := pc.ip.Interpret(ctx, cl)
					if err != nil {
						t.Fatalf("interpret: %v", err)
					}
					pending = append(pending, ic)
				}
				if _, v := quickChoice(ctx, pc.sel, allocate.Policy{}, nodes, pc, nil, admitAll, pending, nil); v == quickUnsure {
					break
				}
			}
			if rng.IntN(3) == 0 {
				// Shares of two GPUs in one request.
				req := controllertest.ShareRequest("s", "2Gi", "10")
				req.Exactly.Count = 2
				ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "d", UID: controllertest.UID(rng.IntN(1 << 30))},
					Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}})
				if err != nil {
					t.Fatal(err)
				}
				pending = []*Claim{ic}
			}
			pol := allocate.Policy{
				Node: []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
				GPU:  []allocate.Strategy{allocate.Binpack, allocate.Spread}[rng.IntN(2)],
			}
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, nodes, pc.NodeUsage, pending)
			ref := choosePlan(plans, pol, nil)
			// Most decisions with the requests' scores from their shapes'
			// indexes over the inventory's list, the others from the
			// scores kept per node.
			if rng.IntN(4) != 0 {
				cache.inventory(nodes)
			} else {
				cache.inventory(nil)
			}
			got, v := boundChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, pending)
			switch v {
			case quickChosen:
				decided++
				if ref == nil || got.Summarize() != ref.Summarize() {
					want := "none"
					if ref != nil {
						want = ref.Summarize()
					}
					t.Fatalf("round %d, policy %+v: bound choice %s, planning every node %s", round, pol, got.Summarize(), want)
				}
				pc.commit(ref)
			case quickNoFit:
				none++
				if ref != nil {
					t.Fatalf("round %d: branch and bound found nothing fits, planning every node gives %s", round, ref.Summarize())
				}
				// Make room again.
				n := nodes[rng.IntN(len(nodes))]
				pc.setUsage(n.Node, make([]allocate.GPUUsage, len(n.Devices)))
			}
		}
	}
	t.Logf("%d pods with several placements decided by branch and bound, %d found to fit nowhere", decided, none)
	if decided < 300 {
		t.Fatalf("only %d decisions by branch and bound", decided)
	}
}

// TestScoreCacheFollowsHost checks that, ranking by stranded GPU, a kept
// score is not used once the node's CPU or memory left changed, which
// pods without GPUs do without touching its GPU usage: the node that was
// best runs short of CPU, and the next decision goes elsewhere.
func TestScoreCacheFollowsHost(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(5, 6))
	pc := newPruneCluster(t, rng, 6, []string{"dgx-a100.txt"}, 0)
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}})
	if err != nil {
		t.Fatal(err)
	}
	pending := []*Claim{ic}
	hist, err := allocate.NewDemandHistory(8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := hist.Record(allocate.DemandShape{GPUs: 1, Host: allocate.Host{CPUMilli: 1000}}); err != nil {
		t.Fatal(err)
	}
	pol := allocate.Policy{Demand: hist.Mix()}
	hosts := map[string]allocate.Host{}
	for _, n := range pc.inv.All() {
		hosts[n.Node] = allocate.Host{CPUMilli: 64_000, MemoryBytes: 256 << 30}
	}
	rank := &hostRanking{left: func(n string) *allocate.Host { h := hosts[n]; return &h }, pod: allocate.Host{CPUMilli: 2000}}
	cache := newScoreCache()
	nodes := pc.inv.All()
	q, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, pending, rank)
	if verdict != quickChosen {
		t.Fatalf("verdict %d, want a choice", verdict)
	}
	first := q.plan.Node.Node
	hosts[first] = allocate.Host{CPUMilli: 500, MemoryBytes: 256 << 30}
	// A change of a node's CPU or memory left counts in its generation,
	// as the controller's ledger.touch counts it for the fit tracker and
	// the Node handlers (TestHostChangesTouchTheLedger).
	pc.touch(first)
	q, verdict = quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, pending, rank)
	if verdict != quickChosen || q.plan.Node.Node == first {
		t.Fatalf("after %s ran short of CPU: got %v, verdict %d; want another node", first, q, verdict)
	}
}

// TestScoreCacheKeepsUnfitNodesWithDemand: with a demand mix, a node that
// cannot take the shape (too few GPUs free) keeps its entry between
// decisions like one that can; it used to be scored again on every
// decision, a fifth of a 70 %-busy cluster for a 4-GPU pod.
func TestScoreCacheKeepsUnfitNodesWithDemand(t *testing.T) {
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(7, 8))
	pc := newPruneCluster(t, rng, 40, []string{"dgx-a100.txt"}, 0.7)
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}}}})
	if err != nil {
		t.Fatal(err)
	}
	hist, err := allocate.NewDemandHistory(8, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := hist.Record(allocate.DemandShape{GPUs: 4}); err != nil {
		t.Fatal(err)
	}
	pol := allocate.Policy{Demand: hist.Mix()}
	nodes := pc.inv.All()
	cache := newScoreCache()
	before := nodesScored.Load()
	if _, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, []*Claim{ic}, nil); verdict == quickUnsure {
		t.Fatal("shortcut did not apply")
	}
	if got := nodesScored.Load() - before; got != int64(len(nodes)) {
		t.Fatalf("first decision scored %d nodes, want all %d", got, len(nodes))
	}
	unfit := 0
	for _, n := range nodes {
		free := 0
		for _, u := range pc.usage[n.Node] {
			if u == (allocate.GPUUsage{}) {
				free++
			}
		}
		if free < 4 {
			unfit++
		}
	}
	if unfit == 0 {
		t.Fatal("the cluster has no node too busy for 4 GPUs: the test checks nothing")
	}
	before = nodesScored.Load()
	if _, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, admitAll, []*Claim{ic}, nil); verdict == quickUnsure {
		t.Fatal("shortcut did not apply")
	}
	if got := nodesScored.Load() - before; got != 0 {
		t.Fatalf("second decision, nothing changed: scored %d nodes again (%d cannot take 4 GPUs), want 0", got, unfit)
	}
}
