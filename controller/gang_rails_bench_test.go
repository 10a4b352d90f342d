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
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/gang"
)

// BenchmarkGangDecisionRails measures what aligned NIC rails add to a
// gang decision: 16 pods of 2 GPUs and 1 NIC under one PCIe root, on idle
// pcie-switch-8 nodes with a NIC per root (4 rails), in leaves of 32:
// candidates and slots, then, aligned, railSlots (the rail keys and each
// node's slots per key), and driver/gang.Place.
//
//	go test -run '^$' -bench GangDecisionRails -benchtime 5x ./controller/
func BenchmarkGangDecisionRails(b *testing.B) {
	for _, nodes := range []int{64, 256} {
		for _, aligned := range []bool{false, true} {
			b.Run(fmt.Sprintf("%d-nodes/aligned=%v", nodes, aligned), func(b *testing.B) { benchGangRails(b, nodes, 16, aligned) })
		}
	}
}

func benchGangRails(b *testing.B, nodes, pods int, aligned bool) {
	objs := objs(classes(), []runtime.Object{controllertest.NICDeviceClass()})
	for i := range nodes {
		name := fmt.Sprintf("n%04d", i)
		node := nicNode(b, name, railNICs())
		node[0].(*corev1.Node).Labels = map[string]string{corev1.LabelHostname: name, gang.LabelLeaf: fmt.Sprintf("leaf-%d", i/32)}
		objs = append(objs, node...)
	}
	claim := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: "rep", Namespace: ns, UID: uuid.NewUUID()},
		Spec: resourceapi.ResourceClaimSpec{Devices: gpusAndNICs(2, 1)}}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "rep", Namespace: ns, UID: uuid.NewUUID(),
		Labels: map[string]string{gangs.LabelGang: "big", gangs.LabelSize: strconv.Itoa(pods)}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "x"}},
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
	spec := gangs.Spec{Ref: gangs.Ref{Namespace: ns, Name: "big", Source: gangs.SourceLabels}, MinCount: pods}
	req, err := c.gangRequest(spec, pods, pods, 2)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		c.decideMu.Lock()
		cands, _ := c.gangCandidates(ctx, candidateQuery{rep: rep, maxPods: pods})
		if aligned {
			req.AlignRails = c.railSlots(ctx, rep, planner.Placement{}, cands, "")
		}
		p, err := gang.Place(c.hierarchy, req, cands)
		c.decideMu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
		if aligned && p.Alignment == "" {
			b.Fatal("aligned gang placed without an alignment")
		}
	}
	b.StopTimer()
}
