package controller

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
	"github.com/gpulink/gpulink/driver/topology"
)

// BenchmarkGangDecision is the decision time of issue 31 through the
// controller: a gang of 64 pods × 8 GPUs, each pod with its own claim,
// decided by placeGang (the part of decideGang under the decision lock:
// the node filter, each candidate node's slots, driver/gang.Place, and
// every pod's claims planned and assumed on its node). The writes are not
// included. The nodes are DGX A100s (8 GPUs) in a SuperPOD-like hierarchy
// (32 nodes per leaf, 8 leaves per spine, 4 spines per zone).
//
//   - idle-1024-nodes: every node idle (the set-up measured first).
//   - 5000-nodes: as driver/gang's BenchmarkPlace, a random 45 % of the
//     nodes busy and 15 % partly used; each placed gang is then held
//     (its devices assumed under a running gang's identity) and the one
//     placed four decisions earlier released, so that about 128 nodes
//     change between decisions as in a running cluster.
//   - 5000-nodes-cold: the same, with every node's usage generation moved
//     before each decision, so that nothing kept from the decision before
//     is valid (the worst case: a decision after every node changed).
//
// It reports p50 and p99 wall time per decision (goal: p99 < 100 ms at
// 5,000 nodes) and the process's CPU time over the decision, the workers
// planning nodes with it included (on a shared machine the wall time also
// counts the waits for a core).
//
//	go test -run '^$' -bench GangDecision -benchtime 50x ./controller/
func BenchmarkGangDecision(b *testing.B) {
	b.Run("idle-1024-nodes-64x8", func(b *testing.B) {
		gb := newGangBench(b, 1024, 64, 0)
		gb.run(b, false)
	})
	gb := newGangBench(b, 5000, 64, 0.45)
	b.Run("5000-nodes-64x8", func(b *testing.B) { gb.run(b, false) })
	b.Run("5000-nodes-64x8-cold", func(b *testing.B) { gb.run(b, true) })
}

// gangBench is a running controller over a fake cluster and one gang of
// pods (each with its own claim) that it leaves waiting: the pods name a
// gang one larger than them, and the benchmark decides them itself.
type gangBench struct {
	c     *Controller
	ctx   context.Context
	spec  gangs.Spec
	req   gang.Request
	own   planner.Placement
	ready []*gangMember
	stop  func()
	iter  int
	pools []string
	holds []func(string, bool)
}

// newGangBench builds nodes 8-GPU nodes, a fraction busy of them fully
// used and a further 15 % partly (random, fixed seed), and a gang of pods
// × 8 GPUs.
func newGangBench(b *testing.B, nodes, pods int, busy float64) *gangBench {
	b.Helper()
	topo, err := topology.ParseFile("../driver/topology/testdata/dgx-a100.txt")
	if err != nil {
		b.Fatal(err)
	}
	objs := classes()
	for i := range nodes {
		name := fmt.Sprintf("n%04d", i)
		s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
		if err != nil {
			b.Fatal(err)
		}
		n := controllertest.Node(name)
		n.Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: fmt.Sprintf("leaf-%d", i/32),
			gang.LabelSpine: fmt.Sprintf("spine-%d", i/256), gang.LabelZone: fmt.Sprintf("zone-%d", i/1024)}
		objs = append(objs, n, s)
	}
	var gangPods []*corev1.Pod
	for i := range pods {
		name := fmt.Sprintf("worker-%d", i)
		claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID()},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}}}}
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, UID: uuid.NewUUID(),
			// One pod short of the gang: the running controller leaves it waiting.
			Labels: map[string]string{gangs.LabelGang: "big", gangs.LabelSize: strconv.Itoa(pods + 1)}},
			Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x",
				Resources: corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("16"), corev1.ResourceMemory: resource.MustParse("64Gi")}}}},
				SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
				ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To(name)}}}}
		objs = append(objs, claim, pod)
		gangPods = append(gangPods, pod)
	}
	c, ctx, stop := runBenchController(b, objs, nodes)
	gb := &gangBench{c: c, ctx: ctx, stop: stop}
	// The cluster's usage: claims of running pods, assumed once.
	r := rand.New(rand.NewPCG(64, 8))
	for i := range nodes {
		used := 0
		switch x := r.IntN(100); {
		case float64(x) < busy*100:
			used = 8
		case float64(x) < busy*100+15 && busy > 0:
			used = 1 + r.IntN(7)
		}
		n := c.inv.Node(fmt.Sprintf("n%04d", i))
		gb.pools = append(gb.pools, n.Pool)
		var uses []planner.DeviceUse
		for pos := range used {
			uses = append(uses, planner.DeviceUse{Key: planner.DeviceKey{Pool: n.Pool, Device: n.Devices[pos].Name}, Exclusive: true})
		}
		if len(uses) > 0 {
			if _, ok := c.ledger.Assume(types.UID("bench-running/"+n.Node), uses); !ok {
				b.Fatal("running usage not assumed")
			}
		}
	}
	for _, pod := range gangPods {
		m := &gangMember{pod: pod, key: ns + "/" + pod.Name}
		m.pc = c.collectClaims(ctx, pod)
		if len(m.pc.ours) != 1 {
			b.Fatalf("pod %s: claims %+v", pod.Name, m.pc)
		}
		m.pending = m.pc.ours
		gb.ready = append(gb.ready, m)
	}
	gb.spec = gangs.Spec{Ref: gangs.Ref{Namespace: ns, Name: "big", Source: gangs.SourceLabels}, MinCount: pods}
	if gb.req, err = c.gangRequest(gb.spec, pods, pods, 8); err != nil {
		b.Fatal(err)
	}
	if gb.own, err = planner.PodPlacement(gangPods[0], gb.ready[0].pending); err != nil {
		b.Fatal(err)
	}
	return gb
}

// step takes one decision under the decision lock and holds its devices
// as a running gang's, releasing the gang held four decisions before.
// cold moves every node's usage generation first. It returns the wall and
// the thread CPU time of the decision.
func (gb *gangBench) step(b *testing.B, cold bool) (wall, cpu time.Duration) {
	c := gb.c
	c.decideMu.Lock()
	defer c.decideMu.Unlock()
	if cold {
		for _, pool := range gb.pools {
			c.ledger.Touch(pool)
		}
	}
	start, cpuStart := time.Now(), processCPU(b)
	dec, _, _, err := c.placeGang(gb.ctx, gangAsk{spec: gb.spec, rep: gb.ready[0], ready: gb.ready, own: gb.own, req: &gb.req})
	wall, cpu = time.Since(start), processCPU(b)-cpuStart
	if err != nil {
		b.Fatal(err)
	}
	var uses []planner.DeviceUse
	for _, pw := range dec.pods {
		for _, res := range pw.plan.Claims {
			for _, r := range res {
				for _, pos := range r.Positions {
					uses = append(uses, planner.DeviceUse{Key: planner.DeviceKey{Pool: pw.plan.Node.Pool, Device: pw.plan.Node.Devices[pos].Name}, Exclusive: true})
				}
			}
		}
	}
	c.dropGang(dec)
	gb.iter++
	hold, ok := c.ledger.Assume(types.UID(fmt.Sprintf("bench-gang/%d", gb.iter)), uses)
	if !ok {
		b.Fatal("gang not held")
	}
	gb.holds = append(gb.holds, hold)
	if len(gb.holds) > 4 {
		gb.holds[0]("", false)
		gb.holds = gb.holds[1:]
	}
	return wall, cpu
}

func (gb *gangBench) run(b *testing.B, cold bool) {
	// The first decision pays for the per-node memos (selectors); the
	// next ones show the steady state.
	gb.step(b, cold)
	var took, cpu []time.Duration
	b.ResetTimer()
	for range b.N {
		w, c := gb.step(b, cold)
		took = append(took, w)
		cpu = append(cpu, c)
	}
	b.StopTimer()
	slices.Sort(took)
	slices.Sort(cpu)
	b.ReportMetric(quantileMS(took, 0.5), "p50-ms")
	b.ReportMetric(quantileMS(took, 0.99), "p99-ms")
	b.ReportMetric(quantileMS(cpu, 0.5), "p50-cpu-ms")
	b.ReportMetric(quantileMS(cpu, 0.99), "p99-cpu-ms")
}

// quantileMS is the f quantile of sorted durations, in milliseconds.
func quantileMS(sorted []time.Duration, f float64) float64 {
	return float64(sorted[int(f*float64(len(sorted)-1))].Microseconds()) / 1000
}

// processCPU is the process's CPU time (user and system): the deciding
// goroutine's and the workers' that plan nodes with it (planner's
// parallel.go), which the deciding thread's alone no longer counts. The
// fake cluster's informers are idle while the benchmark decides.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkGangReplacementDecision is the decision for one replacement
// pod (8 GPUs) of a gang that prefers one leaf and has a pod placed on
// n0100 (leaf-3), on BenchmarkGangDecision's 5,000 nodes: gangHome (where
// the placed pod is, and the domains around it) and placeGangNear, which
// tries them tightest first (gang_home.go).
//
//   - fits-in-leaf: leaf-3 has free nodes: found at the second step.
//   - leaf-full: every node of leaf-3 is busy: the leaf, then the spine
//     is tried, which has room.
func BenchmarkGangReplacementDecision(b *testing.B) {
	gb := newGangBench(b, 5000, 1, 0.45)
	c := gb.c
	spec := gb.spec
	spec.Level, spec.Policy = gang.LabelLeaf, gangs.Preferred
	placed := &gangMember{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "placed", Namespace: ns}, Spec: corev1.PodSpec{NodeName: "n0100"}}, handedOver: true}
	members := append([]*gangMember{placed}, gb.ready...)
	decide := func(b *testing.B, wantLevel int) {
		var took []time.Duration
		for range b.N {
			c.decideMu.Lock()
			start := time.Now()
			home := c.gangHome(gb.ctx, spec, members)
			dec, _, _, step, err := c.placeGangNear(gb.ctx, gangAsk{spec: spec, rep: gb.ready[0], ready: gb.ready, own: gb.own, req: &gb.req}, home)
			took = append(took, time.Since(start))
			if err == nil {
				c.dropGang(dec)
			}
			c.decideMu.Unlock()
			if err != nil {
				b.Fatal(err)
			}
			if got := home.steps[step].level; got != wantLevel {
				b.Fatalf("placed at step level %d, want %d", got, wantLevel)
			}
		}
		slices.Sort(took)
		b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
		b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
	}
	// fill takes every GPU of nodes n<from>-n<to-1> (a GPU already in
	// use counts once: a usage is exclusive or not).
	fill := func(uid string, from, to int) {
		var uses []planner.DeviceUse
		for i := from; i < to; i++ {
			n := c.inv.Node(fmt.Sprintf("n%04d", i))
			for pos := range n.Devices {
				uses = append(uses, planner.DeviceUse{Key: planner.DeviceKey{Pool: n.Pool, Device: n.Devices[pos].Name}, Exclusive: true})
			}
		}
		c.decideMu.Lock()
		defer c.decideMu.Unlock()
		if _, ok := c.ledger.Assume(types.UID(uid), uses); !ok {
			b.Fatalf("%s not held", uid)
		}
	}
	fill("bench-placed", 100, 101) // the placed pod's GPUs
	leaf, _ := c.hierarchy.LevelOfKey(gang.LabelLeaf)
	spine, _ := c.hierarchy.LevelOfKey(gang.LabelSpine)
	b.Run("fits-in-leaf", func(b *testing.B) { decide(b, leaf) })
	fill("bench-leaf-3", 96, 128)
	b.Run("leaf-full", func(b *testing.B) { decide(b, spine) })
}
