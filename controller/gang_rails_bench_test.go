package controller

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/gang"
)

// BenchmarkGangDecisionRails measures what aligned NIC rails add to a
// gang decision: 16 pods of 2 GPUs and 1 NIC under one PCIe root, on idle
// pcie-switch-8 nodes with a NIC per root (4 rails), in leaves of 32:
// candidates and slots, then, aligned, railSlots (the rail keys and each
// node's slots per key), and driver/gang.Place. The 5,000-node case shows
// how a GPU+NIC gang's decision grows with the cluster
// (docs/performance/gangs.md, Decision time). The first decision, which
// pays for the per-node memos, is not counted; warm is a waiting gang's
// retry with nothing changed (the slot counts kept), cold every node's
// usage moved before each decision (all counted again), as
// BenchmarkGangDecision's. Per decision: p50-ms and p99-ms wall.
//
//	go test -run '^$' -bench GangDecisionRails -benchtime 5x ./controller/
func BenchmarkGangDecisionRails(b *testing.B) {
	for _, nodes := range []int{64, 256, 5000} {
		for _, aligned := range []bool{false, true} {
			for _, mode := range []string{"warm", "cold"} {
				b.Run(fmt.Sprintf("%d-nodes/aligned=%v/%s", nodes, aligned, mode), func(b *testing.B) { benchGangRails(b, nodes, 16, aligned, mode == "cold") })
			}
		}
	}
}

func benchGangRails(b *testing.B, nodes, pods int, aligned, cold bool) {
	c, ctx, pod := startNICBench(b, nicBench{nodes: nodes, levels: []nicLevel{{gang.LabelLeaf, "leaf", 32}},
		podLabels: map[string]string{gangs.LabelGang: "big", gangs.LabelSize: strconv.Itoa(pods)}})
	rep := &gangMember{pod: pod, key: ns + "/rep"}
	rep.pc = c.collectClaims(ctx, pod)
	if len(rep.pc.ours) != 1 {
		b.Fatalf("claims %+v", rep.pc)
	}
	rep.pending = rep.pc.ours
	spec := gangs.Spec{Ref: gangs.Ref{Namespace: ns, Name: "big", Source: gangs.SourceLabels}, MinCount: pods}
	req, err := c.gangRequest(spec, pods, pods, 2)
	if err != nil {
		b.Fatal(err)
	}
	decide := func() time.Duration {
		c.decideMu.Lock()
		defer c.decideMu.Unlock()
		if cold {
			for _, n := range c.inv.All() {
				c.ledger.Touch(n.Pool)
			}
		}
		start := time.Now()
		q := candidateQuery{rep: rep, maxPods: pods, alignRails: aligned}
		if aligned {
			q.firstRails = map[string]string{}
		}
		cands, _ := c.gangCandidates(ctx, q)
		if aligned {
			req.AlignRails = c.railSlots(ctx, railAsk{rep: rep, firstRails: q.firstRails}, cands)
		}
		p, err := gang.Place(c.hierarchy, req, cands)
		took := time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if aligned && p.Alignment == "" {
			b.Fatal("aligned gang placed without an alignment")
		}
		return took
	}
	decide()
	var took []time.Duration
	b.ResetTimer()
	for range b.N {
		took = append(took, decide())
	}
	b.StopTimer()
	slices.Sort(took)
	b.ReportMetric(quantileMS(took, 0.5), "p50-ms")
	b.ReportMetric(quantileMS(took, 0.99), "p99-ms")
}

// BenchmarkAlignedPodNearWaiting is the decision for one pod of a gang
// with gang-rails: aligned (2 GPUs and 1 NIC under one PCIe root) whose
// placed pod, on n0100, uses rail 0, when rail 0 is taken on every node:
// allocatePodNear tries the placed pod's node, leaf, spine and zone, then
// the whole cluster, with the other rails' NICs held off in the planning
// (planner.HeldOff), and the pod waits. That is what each retry of such a
// waiting pod costs: the nodes that did not change since the retry
// before keep their answer (none changes here). unaligned is the same pod without the rail
// waiting for any NIC (every NIC taken), through the same domains.
// 5,000 idle pcie-switch-8 nodes with a NIC per PCIe root, 32 per leaf,
// 256 per spine, 1,024 per zone; the running controller leaves the pod
// alone (its gang is one pod short).
//
//	go test -run '^$' -bench AlignedPodNearWaiting -benchtime 20x ./controller/
func BenchmarkAlignedPodNearWaiting(b *testing.B) {
	const nodes = 5000
	c, ctx, pod := startNICBench(b, nicBench{nodes: nodes,
		levels:    []nicLevel{{gang.LabelLeaf, "leaf", 32}, {gang.LabelSpine, "spine", 256}, {gang.LabelZone, "zone", 1024}},
		podLabels: map[string]string{gangs.LabelGang: "big", gangs.LabelSize: "2", gangs.LabelRails: gangs.RailsAligned}})
	// take holds the NICs of the rails on every node.
	take := func(rails ...string) {
		var uses []planner.DeviceUse
		for _, n := range c.inv.All() {
			for _, d := range c.inv.Foreign(n.Node).Devices {
				if slices.Contains(rails, d.Name) {
					uses = append(uses, planner.DeviceUse{Key: d.Key(), Exclusive: true})
				}
			}
		}
		c.decideMu.Lock()
		_, held := c.ledger.Assume(types.UID("bench-"+strings.Join(rails, ",")), uses)
		c.decideMu.Unlock()
		if !held || len(uses) != len(rails)*nodes {
			b.Fatalf("%v held %v on %d devices", rails, held, len(uses))
		}
	}
	pc := c.collectClaims(ctx, pod)
	if len(pc.ours) != 1 {
		b.Fatalf("claims %+v", pc)
	}
	spec := gangs.Spec{Ref: gangs.Ref{Namespace: ns, Name: "big", Source: gangs.SourceLabels}, MinCount: 2,
		Level: gang.LabelLeaf, Policy: gangs.Preferred, AlignRails: true}
	placed := &gangMember{pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "placed", Namespace: ns}, Spec: corev1.PodSpec{NodeName: "n0100"}}, handedOver: true}
	for _, aligned := range []bool{true, false} {
		if aligned {
			take("nic-0")
		} else {
			take("nic-1", "nic-2", "nic-3")
		}
		b.Run(map[bool]string{true: "aligned", false: "unaligned"}[aligned], func(b *testing.B) {
			home := c.gangHome(ctx, spec, []*gangMember{placed})
			if aligned {
				home.rail = controllertest.NICDriver + "=0"
			}
			if len(home.steps) != 5 {
				b.Fatalf("home steps %d, want the node, leaf, spine, zone and cluster", len(home.steps))
			}
			var took []time.Duration
			for range b.N {
				start := time.Now()
				if err := c.allocatePodNear(ctx, ns+"/rep", pod, pc, pc.ours, home); err != nil {
					b.Fatal(err)
				}
				took = append(took, time.Since(start))
			}
			b.StopTimer()
			cl, err := c.client.ResourceV1().ResourceClaims(ns).Get(ctx, "rep", metav1.GetOptions{})
			if err != nil {
				b.Fatal(err)
			}
			c.mu.Lock()
			waiting := c.waiting.Has(ns + "/rep")
			c.mu.Unlock()
			if cl.Status.Allocation != nil || !waiting {
				b.Fatalf("claim allocated %v, pod waiting %v: want it waiting", cl.Status.Allocation != nil, waiting)
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds())/1000, "p50-ms")
			b.ReportMetric(float64(took[len(took)*99/100].Microseconds())/1000, "p99-ms")
		})
	}
}

// nicBench is a cluster of idle pcie-switch-8 nodes with a NIC per PCIe
// root (railNICs), labelled into levels, and one gated pod "rep" whose
// claim asks for 2 GPUs and 1 NIC under one root.
type nicBench struct {
	nodes     int
	levels    []nicLevel
	podLabels map[string]string
}

// nicLevel labels node i with key=<prefix>-<i/per>.
type nicLevel struct {
	key, prefix string
	per         int
}

// startNICBench runs a controller over the cluster until its caches hold
// every node; it stops with the benchmark.
func startNICBench(b *testing.B, nb nicBench) (*Controller, context.Context, *corev1.Pod) {
	b.Helper()
	objs := objs(classes(), []runtime.Object{controllertest.NICDeviceClass()})
	for i := range nb.nodes {
		name := fmt.Sprintf("n%04d", i)
		node := nicNode(b, name, railNICs())
		labels := map[string]string{corev1.LabelHostname: name}
		for _, l := range nb.levels {
			labels[l.key] = fmt.Sprintf("%s-%d", l.prefix, i/l.per)
		}
		node[0].(*corev1.Node).Labels = labels
		objs = append(objs, node...)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "rep", Namespace: ns, UID: uuid.NewUUID()},
		Spec: resourceapi.ResourceClaimSpec{Devices: gpusAndNICs(2, 1)}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rep", Namespace: ns, UID: uuid.NewUUID(), Labels: nb.podLabels},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}},
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("rep")}}}}
	objs = append(objs, claim, pod)
	c, ctx, _ := runBenchController(b, objs, nb.nodes)
	return c, ctx, pod
}
