package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
)

func claimOfSizes(uid string, share bool, sizes ...int) *planner.Claim {
	ic := &planner.Claim{Claim: &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid)}}}
	for _, s := range sizes {
		ic.Requests = append(ic.Requests, &planner.RequestSpec{Alternatives: []*planner.Alternative{{Count: s, Share: share}}})
	}
	return ic
}

// TestMixRecorderCountsEachClaimOnce: a claim's whole-GPU requests count
// once however often its pod is retried; shares and allocationMode All
// do not count; the mix is a function of the sequence.
func TestMixRecorderCountsEachClaimOnce(t *testing.T) {
	run := func() (*planner.MixRecorder, allocate.Policy) {
		r, err := planner.NewMixRecorder(planner.MixConfig{Window: 8, Refresh: 1})
		if err != nil {
			t.Fatal(err)
		}
		all := claimOfSizes("all", false, 0)
		all.Requests[0].Alternatives[0].All = true
		base := allocate.Policy{Node: allocate.Binpack}
		var pol allocate.Policy
		for range 3 {
			pol = r.Policy(context.Background(), base, []*planner.Claim{claimOfSizes("a", false, 4, 2), claimOfSizes("s", true, 1), all})
		}
		return r, pol
	}
	r, pol := run()
	if got, want := r.Hist.String(), "1:1 2:2 3:1 4:2 5:1 6:1 7:1 8:1"; got != want {
		t.Fatalf("counts %q, want %q (one 4 and one 2 on the prior)", got, want)
	}
	if pol.Node != allocate.Binpack || pol.Mix != r.Hist.Mix() {
		t.Fatalf("policy %+v: want the base policy with the recent mix", pol)
	}
	if _, again := run(); again.Mix.String() != pol.Mix.String() {
		t.Fatalf("same sequence, different mix: %s vs %s", again.Mix, pol.Mix)
	}

	off, err := planner.NewMixRecorder(planner.MixConfig{Window: -1})
	if err != nil {
		t.Fatal(err)
	}
	fixed := allocate.Policy{Mix: allocate.DefaultSizeMix}
	if got := off.Policy(context.Background(), fixed, []*planner.Claim{claimOfSizes("a", false, 4)}); got != fixed {
		t.Fatalf("recorder off changed the policy: %+v", got)
	}
	if _, err := planner.NewMixRecorder(planner.MixConfig{Window: 4, Refresh: 5}); err == nil {
		t.Fatal("refresh above the window accepted")
	}
}

// TestRecentMixChangesDecision: on the P40 box (PCIe switches {0,1,2} and
// {3,4,5,6}) with 5 and 6 held, the controller puts a one-GPU request on
// GPU 0 after a run of pair requests (two switch pairs stay: 1-2 and
// 3-4) and on GPU 3 after a run of triples (0-1-2 stays). The earlier
// requests need NVLink, which the box lacks, so they wait and leave the
// GPUs as they are: only the mix differs between the two runs.
func TestRecentMixChangesDecision(t *testing.T) {
	for _, tc := range []struct {
		size int
		want []int
	}{{2, []int{0}}, {3, []int{3}}} {
		t.Run(fmt.Sprintf("after-%d-gpu-requests", tc.size), func(t *testing.T) {
			const node = "p40"
			slice, err := controllertest.Slice(node, fixtureTopology(t, "p40-pcie-7.txt"), controllertest.SliceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "old", Namespace: ns, UID: uuid.NewUUID()}, Spec: corev1.PodSpec{NodeName: node}}
			held := &resourceapi.ResourceClaim{
				ObjectMeta: metav1.ObjectMeta{Name: "held", Namespace: ns, UID: uuid.NewUUID(), Finalizers: []string{driver.ClaimFinalizer}},
				Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}}},
				Status: resourceapi.ResourceClaimStatus{
					Allocation:  &resourceapi.AllocationResult{NodeSelector: planner.NodeSelectorFor(node), AllocationTimestamp: ptr.To(metav1.Now())},
					ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: "old", UID: old.UID}},
				},
			}
			for _, i := range []int{5, 6} {
				held.Status.Allocation.Devices.Results = append(held.Status.Allocation.Devices.Results, resourceapi.DeviceRequestAllocationResult{
					Request: "g", Driver: driver.Name, Pool: node, Device: driver.DeviceName(i)})
			}
			h := newHarnessWith(t, Config{Workers: 1, DeviceTaintRules: true, Mix: planner.MixConfig{Window: 16, Refresh: 1}},
				objs(classes(), []runtime.Object{controllertest.Node(node), slice, old, held})...).start()
			for i := range 6 {
				name := fmt.Sprintf("nvlink-%d", i)
				h.claim(name, resourceapi.DeviceClaim{
					Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", int64(tc.size))},
					Config:   []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()},
				})
				h.pod(name, true, name)
				// Decided (and waiting) before the next one: the order of
				// the history is the order of decisions.
				h.waitEvent(ns+"/"+name, report.ReasonWaiting)
			}
			h.claim("one", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 1)}})
			h.pod("one", true, "one")
			if got := indices(t, devicesOf(h.waitAllocated("one"))); !slices.Equal(got, tc.want) {
				t.Errorf("after %d-GPU requests the single GPU went to %v, want %v", tc.size, got, tc.want)
			}
		})
	}
}
