package controller

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/gang"
	"github.com/gpulink/gpulink/driver/topology"
)

// BenchmarkGangDecision measures the controller's part of a gang decision
// for 64 pods × 8 GPUs on idle 8-GPU nodes (DGX A100) in leaves of 32:
// the node filter, each node's slots (trialSlots: the planner on that
// node, again per pod that fits), driver/gang.Place, and planning and
// assuming every pod's claims on its node (dropped again after each
// iteration). The writes are not included.
//
//	go test -run '^$' -bench GangDecision -benchtime 5x ./controller/
func BenchmarkGangDecision(b *testing.B) {
	for _, nodes := range []int{256, 1024} {
		b.Run(strconv.Itoa(nodes)+"-nodes", func(b *testing.B) { benchGangDecision(b, nodes, 64) })
	}
}

func benchGangDecision(b *testing.B, nodes, pods int) {
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
		n.Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: fmt.Sprintf("leaf-%d", i/32), gang.LabelSpine: fmt.Sprintf("spine-%d", i/256)}
		objs = append(objs, n, s)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "rep", Namespace: ns, UID: uuid.NewUUID()},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}}}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rep", Namespace: ns, UID: uuid.NewUUID(),
		Labels: map[string]string{gangs.LabelGang: "big", gangs.LabelSize: strconv.Itoa(pods)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}},
			// Gated: the running controller leaves it waiting for its gang.
			SchedulingGates: []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
			ResourceClaims:  []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimName: ptr.To("rep")}}}}
	objs = append(objs, claim, pod)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := New(Config{Client: fake.NewClientset(objs...), Recorder: &testRecorder{}, Workers: 1,
		Policy: allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}})
	if err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	for deadline := time.Now().Add(time.Minute); !c.Ready() || len(c.inv.All()) < nodes; {
		if time.Now().After(deadline) {
			b.Fatal("caches not synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	rep := &gangMember{pod: pod, key: ns + "/rep"}
	rep.pc = c.collectClaims(ctx, pod)
	if len(rep.pc.ours) != 1 {
		b.Fatalf("claims %+v", rep.pc)
	}
	rep.pending = rep.pc.ours
	ready := make([]*gangMember, pods)
	for i := range ready {
		ready[i] = rep
	}
	spec := gangs.Spec{Ref: gangs.Ref{Namespace: ns, Name: "big", Source: gangs.SourceLabels}, MinCount: pods}
	req, err := c.gangRequest(spec, pods, pods, 8)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		c.decideMu.Lock()
		cands, _ := c.gangCandidates(ctx, spec, rep, planner.Placement{}, pods)
		p, err := gang.Place(c.hierarchy, req, cands)
		if err != nil {
			c.decideMu.Unlock()
			b.Fatal(err)
		}
		// The same pod stands for every member: plan each on its node
		// without assuming the shared claim twice.
		for _, node := range p.Nodes {
			if d := c.planner.Decide(ctx, planner.Request{Pod: pod, Pending: rep.pending, Only: node}); d.Chosen == nil {
				b.Fatalf("pod does not fit on %s", node)
			}
		}
		c.decideMu.Unlock()
	}
	b.StopTimer()
}
