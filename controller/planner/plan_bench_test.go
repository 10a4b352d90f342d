package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// BenchmarkPlanOneGPU measures one decision (no API writes) for a one-GPU
// claim on a cluster of 64 eight-GPU V100 nodes, half full.
func BenchmarkPlanOneGPU(b *testing.B) {
	benchmarkPlan(b, controllertest.WholeRequest("g", 1))
}

// BenchmarkPlanShare is the same for a share.
func BenchmarkPlanShare(b *testing.B) {
	benchmarkPlan(b, controllertest.ShareRequest("s", "2Gi", "20"))
}

func benchmarkPlan(b *testing.B, req resourceapi.DeviceRequest) {
	topo, err := controllertest.ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	if err != nil {
		b.Fatal(err)
	}
	inv := NewInventory()
	l := NewLedger()
	for n := range 64 {
		s, err := controllertest.Slice(fmt.Sprintf("node-%02d", n), topo, controllertest.SliceOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := inv.Upsert(s); err != nil {
			b.Fatal(err)
		}
		var uses []DeviceUse
		for i := range n % 8 {
			uses = append(uses, DeviceUse{Key: DeviceKey{Pool: s.Spec.Pool.Name, Device: fmt.Sprintf("gpu-%d", i)}, Exclusive: true})
		}
		l.setLocked(controllertest.UID(n), &claimUse{uses: uses})
	}
	sel := NewSelectorEvaluator()
	classes := map[string]*resourceapi.DeviceClass{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	ip := NewInterpreter(controllertest.ClassLister(classes), sel, inv)
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}}}
	ctx := context.Background()
	pol := allocate.Policy{}
	b.ResetTimer()
	for b.Loop() {
		ic, _, err := ip.Interpret(ctx, claim)
		if err != nil {
			b.Fatal(err)
		}
		var plans []*Plan
		for _, n := range inv.All() {
			if p, _ := planNode(ctx, sel, pol, n, l.NodeUsage(n), []*Claim{ic}); p != nil {
				plans = append(plans, p)
			}
		}
		if choosePlan(plans, pol, nil) == nil {
			b.Fatal("no plan")
		}
	}
}

// BenchmarkDecision5000Nodes measures one decision (no API writes: the
// choice made under the decision lock, node filter included) over 5,000
// in-memory eight-GPU nodes of mixed kinds with random usage, for the
// scale test's pods with one placement. Each decision is committed and the
// one made 64 decisions earlier released, so that nodes' usage changes as
// in a running cluster. exhaustive filters and plans every node (what
// choosePlan ranks); quick-uncached ranks every node afresh; quick keeps
// scores between decisions (what the controller does). It reports the p50
// and p99 of one decision.
func BenchmarkDecision5000Nodes(b *testing.B) {
	pc, nodes, filter := benchCluster(b, 8)
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "pod"}, Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c",
		Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("8"), corev1.ResourceMemory: resource.MustParse("64Gi")}}}}}}
	whole := func(n int64, cfg ...resourceapi.DeviceClaimConfiguration) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", n)}, Config: cfg}}}
	}
	share := func(mem, cores string) *resourceapi.ResourceClaim {
		return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", mem, cores)}}}}
	}
	// The scale test's pods with one placement (test/scale, scaleRequests), by weight.
	var mix [][]*Claim
	for _, w := range []struct {
		n  int
		cl *resourceapi.ResourceClaim
	}{{35, whole(1)}, {20, whole(2)}, {12, whole(4)}, {3, whole(8)}, {5, whole(2, controllertest.RequiredNVLinkConfig())},
		{15, share("4Gi", "25")}, {10, share("12Gi", "50")}} {
		ic, _, err := pc.ip.Interpret(ctx, w.cl)
		if err != nil {
			b.Fatal(err)
		}
		for range w.n {
			mix = append(mix, []*Claim{ic})
		}
	}
	pol := allocate.Policy{}
	run := func(b *testing.B, decide func([]*Claim) *Plan) {
		runDecisions(b, pc, mix, decide)
	}
	logger := klog.Background()
	b.Run("exhaustive", func(b *testing.B) {
		run(b, func(pending []*Claim) *Plan {
			cands, _ := filter.Candidates(logger, pod, nodes, nil, nil)
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, cands, pc.NodeUsage, pending)
			return choosePlan(plans, pol, nil)
		})
	})
	// quick and the stranding variants rank with each shape's index over
	// the inventory's list, as Planner.Decide does; the -kept variants
	// rank every node by its kept score, as a decision restricted to some
	// nodes does (and every decision did before the index).
	quick := func(cache *scoreCache, indexed bool) func([]*Claim) *Plan {
		if indexed {
			cache.inventory(nodes)
		}
		return func(pending []*Claim) *Plan {
			pf := filter.forPod(logger, pod, nil, nil)
			q, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, pf.admit, pending, nil)
			if verdict != quickChosen {
				b.Fatal("shortcut did not apply")
			}
			return q.plan
		}
	}
	b.Run("quick-uncached", func(b *testing.B) { run(b, quick(nil, false)) })
	b.Run("quick", func(b *testing.B) { run(b, quick(newScoreCache(), true)) })
	b.Run("quick-kept", func(b *testing.B) { run(b, quick(newScoreCache(), false)) })
	// quick-stranding is quick with --rank-by-stranding: each decision is
	// recorded in the demand mix and ranks by the GPUs it strands for it.
	// The -sizemix variants also keep the recent size mix as the
	// controller does (every pod's claim is new there, so each whole-GPU
	// request is recorded and the mix snapshot every 64 of them), which
	// the plain variants leave out: the benchmark's claims are reused, and
	// MixRecorder counts a claim once.
	stranding := func(sizeMix, indexed bool) func(b *testing.B) {
		return func(b *testing.B) {
			rec, err := newDemandRecorder(true)
			if err != nil {
				b.Fatal(err)
			}
			hist, err := allocate.NewSizeHistory(allocate.DefaultHistoryWindow, allocate.DefaultHistoryRefresh)
			if err != nil {
				b.Fatal(err)
			}
			cache := newScoreCache()
			if indexed {
				cache.inventory(nodes)
			}
			var held *allocate.SizeMix
			run(b, func(pending []*Claim) *Plan {
				p := pol
				if sizeMix {
					if a := pending[0].Requests[0].Alternatives[0]; !a.Share {
						hist.Record(a.Count)
					}
					held = allocate.HoldSize(held, hist.Mix())
					p.Mix = held
				}
				pf := filter.forPod(logger, pod, nil, nil)
				q, verdict := quickChoice(ctx, pc.sel, rec.policy(p, func() []*allocate.NodeState { return filter.nodesNow(nodes, pc.NodeUsage) }), nodes, pc, cache, pf.admit, pending, rec.ranking(filter.HostLeft, pod))
				if verdict != quickChosen {
					b.Fatal("shortcut did not apply")
				}
				rec.record(ctx, pod, q.plan)
				return q.plan
			})
		}
	}
	b.Run("quick-stranding", stranding(false, true))
	b.Run("quick-stranding-kept", stranding(false, false))
	b.Run("quick-stranding-sizemix", stranding(true, true))
	b.Run("quick-sizemix", func(b *testing.B) {
		hist, err := allocate.NewSizeHistory(allocate.DefaultHistoryWindow, allocate.DefaultHistoryRefresh)
		if err != nil {
			b.Fatal(err)
		}
		cache := newScoreCache()
		cache.inventory(nodes)
		var held *allocate.SizeMix
		run(b, func(pending []*Claim) *Plan {
			p := pol
			if a := pending[0].Requests[0].Alternatives[0]; !a.Share {
				hist.Record(a.Count)
			}
			held = allocate.HoldSize(held, hist.Mix())
			p.Mix = held
			pf := filter.forPod(logger, pod, nil, nil)
			q, verdict := quickChoice(ctx, pc.sel, p, nodes, pc, cache, pf.admit, pending, nil)
			if verdict != quickChosen {
				b.Fatal("shortcut did not apply")
			}
			return q.plan
		})
	})
}

// benchCluster is the cluster of the 5,000-node decision benchmarks:
// eight-GPU nodes of mixed kinds, 70 % of them busy (random usage from
// seed), with a node filter over their Node objects.
func benchCluster(b *testing.B, seed uint64) (*pruneCluster, []*NodeInventory, *NodeFilter) {
	pc := newPruneCluster(b, rand.New(rand.NewPCG(5000, seed)), 5000, controllertest.EightGPUFixtures, 0.7)
	nodes := pc.inv.All()
	return pc, nodes, benchNodeFilter(b, nodes)
}

// benchNodeFilter is a node filter over Node objects for the nodes, with
// pods counted on some of them.
func benchNodeFilter(b *testing.B, nodes []*NodeInventory) *NodeFilter {
	indexer := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{})
	fit := NewFitTracker()
	for i, n := range nodes {
		if err := indexer.Add(controllertest.Node(n.Node)); err != nil {
			b.Fatal(err)
		}
		if i%3 == 0 {
			fit.Observe(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "bound", Namespace: "d", UID: types.UID("bound-" + n.Node)},
				Spec: corev1.PodSpec{NodeName: n.Node, Containers: []corev1.Container{{Name: "c",
					Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16")}}}}}})
		}
	}
	return &NodeFilter{Nodes: corelisters.NewNodeLister(indexer), Fit: fit}
}

// BenchmarkWaiting5000Nodes measures the decision for a pod that fits no
// node (nine GPUs on eight-GPU nodes) over the cluster of
// BenchmarkDecision5000Nodes, including the waiting event's counts and
// reasons: exhaustive filters and plans every node; quick is what the
// controller does (the scores say nothing fits, every node is filtered
// for the counts, a few are planned for the reasons).
func BenchmarkWaiting5000Nodes(b *testing.B) {
	pc, nodes, filter := benchCluster(b, 9)
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "pod"}}
	ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 9)}}}})
	if err != nil {
		b.Fatal(err)
	}
	pending := []*Claim{ic}
	pol := allocate.Policy{}
	logger := klog.Background()
	b.Run("exhaustive", func(b *testing.B) {
		for b.Loop() {
			cands, _ := filter.Candidates(logger, pod, nodes, nil, nil)
			plans, failed, why := exhaustivePlans(ctx, pc.sel, pol, cands, pc.NodeUsage, pending)
			if len(plans) != 0 || failed != len(nodes) || len(why) == 0 {
				b.Fatalf("%d plans, %d failed, %d reasons", len(plans), failed, len(why))
			}
		}
	})
	b.Run("quick", func(b *testing.B) {
		cache := newScoreCache()
		for b.Loop() {
			pf := filter.forPod(logger, pod, nil, nil)
			if _, verdict := quickChoice(ctx, pc.sel, pol, nodes, pc, cache, pf.admit, pending, nil); verdict != quickNoFit {
				b.Fatalf("verdict %d, want nothing fits", verdict)
			}
			cands, _ := filter.Candidates(logger, pod, nodes, nil, nil)
			if why, ok := explainNoFit(ctx, pc.sel, pol, cands, pc, pending); !ok || len(why) == 0 {
				b.Fatalf("no reasons (%v)", ok)
			}
		}
	})
}

// runDecisions runs decide over the pods of mix in turn (one pod: its
// claims), committing each plan and releasing the one made 64 decisions
// earlier, and reports the p50 and p99 of one decision.
func runDecisions(b *testing.B, pc *pruneCluster, mix [][]*Claim, decide func([]*Claim) *Plan) {
	type undo struct {
		node  string
		usage []allocate.GPUUsage
	}
	var held []undo
	step := func(i int) *Plan {
		pl := decide(mix[i%len(mix)])
		if pl != nil {
			held = append(held, undo{pl.Node.Node, pc.usage[pl.Node.Node]})
			pc.commit(pl)
		}
		if len(held) > 64 {
			pc.setUsage(held[0].node, held[0].usage)
			held = held[1:]
		}
		return pl
	}
	// Selector results and share sizes are memoised per node: the first
	// decision for each kind of request pays for them once.
	for j := range mix {
		step(j)
	}
	var took, cpu []time.Duration
	var scored []int64
	i := 0
	// The decision's own CPU time besides its wall time: on a shared
	// machine the wall time counts the waits for a core too. The thread
	// is locked so that its CPU time is the decision's (GC assists
	// included, background GC workers not).
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		start, before, cpuStart := time.Now(), nodesScored.Load(), threadCPU(b)
		if step(i) == nil {
			b.Fatal("no plan")
		}
		took = append(took, time.Since(start))
		cpu = append(cpu, threadCPU(b)-cpuStart)
		scored = append(scored, nodesScored.Load()-before)
		i += 37
	}
	// Leave the cluster as it was for the next variant.
	for j := len(held) - 1; j >= 0; j-- {
		pc.setUsage(held[j].node, held[j].usage)
	}
	slices.Sort(took)
	p := func(q float64) float64 { return float64(took[int(q*float64(len(took)-1))].Microseconds()) / 1000 }
	b.ReportMetric(p(0.5), "p50-ms")
	b.ReportMetric(p(0.99), "p99-ms")
	b.ReportMetric(p(1), "max-ms")
	slices.Sort(cpu)
	b.ReportMetric(float64(cpu[len(cpu)/2].Microseconds())/1000, "p50-cpu-ms")
	b.ReportMetric(float64(cpu[int(0.99*float64(len(cpu)-1))].Microseconds())/1000, "p99-cpu-ms")
	// Node scores computed afresh per decision: mean and p99.
	slices.Sort(scored)
	var sum int64
	for _, v := range scored {
		sum += v
	}
	b.ReportMetric(float64(sum)/float64(len(scored)), "scored/op")
	b.ReportMetric(float64(scored[int(0.99*float64(len(scored)-1))]), "p99-scored")
}

// threadCPU is the calling thread's CPU time (user and system).
func threadCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(rusageThread, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// rusageThread is RUSAGE_THREAD (Linux).
const rusageThread = 1

// BenchmarkSeveralPlacements5000Nodes is BenchmarkDecision5000Nodes for
// pods with several placements: two claims (2 GPUs and 1 GPU), one claim
// with two requests (4 GPUs and a share), shares of two GPUs. exhaustive
// filters and plans every node; bound is what the controller does
// (boundChoice).
func BenchmarkSeveralPlacements5000Nodes(b *testing.B) {
	pc, nodes, filter := benchCluster(b, 10)
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "pod"}}
	interpret := func(reqs ...resourceapi.DeviceRequest) *Claim {
		ic, _, err := pc.ip.Interpret(ctx, &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "d"},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}})
		if err != nil {
			b.Fatal(err)
		}
		return ic
	}
	twoShares := controllertest.ShareRequest("s", "4Gi", "25")
	twoShares.Exactly.Count = 2
	mix := [][]*Claim{
		{interpret(controllertest.WholeRequest("a", 2)), interpret(controllertest.WholeRequest("b", 1))},
		{interpret(controllertest.WholeRequest("g", 4), controllertest.ShareRequest("s", "4Gi", "25"))},
		{interpret(twoShares)},
	}
	pol := allocate.Policy{}
	logger := klog.Background()
	b.Run("exhaustive", func(b *testing.B) {
		runDecisions(b, pc, mix, func(pending []*Claim) *Plan {
			cands, _ := filter.Candidates(logger, pod, nodes, nil, nil)
			plans, _, _ := exhaustivePlans(ctx, pc.sel, pol, cands, pc.NodeUsage, pending)
			return choosePlan(plans, pol, nil)
		})
	})
	// bound takes the requests' scores from their shapes' indexes over the
	// inventory's list, as Planner.Decide does; bound-kept from the
	// scores kept per node (a decision restricted to some nodes).
	bound := func(indexed bool) func(b *testing.B) {
		return func(b *testing.B) {
			cache := newScoreCache()
			if indexed {
				cache.inventory(nodes)
			}
			runDecisions(b, pc, mix, func(pending []*Claim) *Plan {
				pf := filter.forPod(logger, pod, nil, nil)
				pl, verdict := boundChoice(ctx, pc.sel, pol, nodes, pc, cache, pf.admit, pending)
				if verdict != quickChosen {
					b.Fatalf("verdict %d", verdict)
				}
				return pl
			})
		}
	}
	b.Run("bound", bound(true))
	b.Run("bound-kept", bound(false))
}
