//go:build e2e

package conformance_test

import (
	"context"
	"slices"
	"testing"
)

// nvidiaCases run kubernetes-sigs/dra-driver-nvidia-gpu's quickstart, bats
// and consumable-shares specs and its extended-resource example.
func nvidiaCases() []*peerCase {
	const q, qs, bats, cs = "dra-driver-nvidia-gpu/quickstart-v1/", "dra-driver-nvidia-gpu/quickstart/", "dra-driver-nvidia-gpu/bats/", "dra-driver-nvidia-gpu/consumable-shares/"
	mpsRewrite := portOptions{dropConfig: dropNVIDIAConfig}
	// alone: the node's NVLink pair is free only when no other case of
	// the batch holds one of its GPUs (with the integer-share cases in
	// batches of their own, gpu-test8 shared one with a case that did, and
	// got a PXB pair: the best pair left, not the node's).
	test8 := &peerCase{alone: true, files: []string{qs + "gpu-test8.yaml"}, gpus: 2,
		note: "class, v1beta1 → v1 (`exactly:`); the pair is an NVLink pair",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), 1)
			eachSees(t, r.c.files[0], pods, 2)
			for _, log := range pods[0].logs {
				if l := r.weakestLink(ctx, t, gpus(log)); !l.IsNVLink() {
					t.Errorf("%s: the pair's link is %s, want the node's NVLink pair", r.c.files[0], l)
				}
			}
			return ""
		}}
	mps := func(file, request string, note string) *peerCase {
		o := mpsRewrite
		o.shareCapacity = map[string]map[string]any{request: {"memory": "10Gi", "cores": "50"}}
		return sharesOneGPU(file, 1, o, "50", 10240, note)
	}
	restart := &peerCase{files: []string{bats + "gpu-pod-fail-restart.yaml"}, gpus: 1, opts: exitAfterPrint,
		note: "class; the pod completes with one GPU, its claim is released, a second run gets a GPU again",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			ns := r.nsOf()
			pods := r.waitRunning(ctx, t, ns, 1)
			eachSees(t, r.c.files[0], pods, 1)
			r.waitReleased(ctx, t, ns)
			r.deletePods(ctx, t, ns)
			r.applyFile(ctx, t, r.c.files[0])
			eachSees(t, r.c.files[0], r.waitRunning(ctx, t, ns, 1), 1)
			return ""
		}}
	stress := &peerCase{files: []string{bats + "rc-shared-gpu.yaml", bats + "pods-shared-gpu.yaml"}, gpus: 1,
		applyLater: map[string]bool{bats + "pods-shared-gpu.yaml": true},
		note:       "class, `__INDEX__` = 0…5: six pods on one claim see one GPU, all in reservedFor",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			const n = 6
			for i := range n {
				r.c.opts.index = string(rune('0' + i))
				r.applyFile(ctx, t, r.c.files[1])
			}
			pods := r.waitRunning(ctx, t, r.ns, n)
			eachSees(t, r.c.files[1], pods, 1)
			sameGPUs(t, r.c.files[1], pods)
			if c := r.claims(ctx, t, r.ns)["rc-shared-gpu"]; c == nil || len(c.Status.ReservedFor) != n {
				t.Errorf("%s: claim rc-shared-gpu reserved for %v, want %d pods", r.c.files[0], c.Status.ReservedFor, n)
			}
			return ""
		}}
	noMatch := &peerCase{files: []string{bats + "gpu-cel-nomatch.yaml"},
		note: "CEL domain; the pod stays Pending, its claim unallocated, with gpulink's WaitingForGPUs event",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			r.waitWaiting(ctx, t, r.ns, "pod-cel-nomatch")
			return ""
		}}
	unlimited := sharesOneGPU(cs+"unlimited-sharing.yaml", 2, portOptions{shareClass: true}, "", 0,
		"rewrite: `gpu-share.gpulink.dev` (a capacity-less `gpu.gpulink.dev` request is exclusive); both replicas share one GPU with the class's default share")
	// alone: n pods of 25 cores fill a GPU exactly only when no other
	// case's share is on it; beside one, the first pods decided may be
	// packed onto that share's GPU and the rest take another (fresh-clone
	// make test, 2026-11-28: integer-sharing.yaml split 2 + 2), as HAMi's
	// use_sharing_card did.
	integer := func(file string, n int) *peerCase {
		c := sharesOneGPU(file, n, portOptions{capacities: map[string]string{"shares": ""}, shareCapacity: map[string]map[string]any{"*": {"cores": "25"}}}, "25", -1,
			"rewrite: `shares: 1` → `cores: \"25\"` (gpulink has no `shares` capacity); the pods share one GPU")
		c.alone = true
		return c
	}
	fullExt := &peerCase{files: []string{"dra-driver-nvidia-gpu/extended-resources/gpu-full.yaml"}, gpus: 1,
		note: "unchanged resources: gpulink's webhook translates `nvidia.com/gpu: 1` into a claim; one whole GPU",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), 1)
			eachSees(t, r.c.files[0], pods, 1)
			noMPS(t, r.c.files[0], pods[0])
			return ""
		}}
	// One container, two claims: the controller marks the two claims as
	// used together (gpu.gpulink.dev/container-claims) and the plugin
	// numbers their GPUs as one set in both claims' environments, so
	// whichever the runtime applies last, the container sees both GPUs.
	twoClaims := &peerCase{files: []string{bats + "gpu-two-claims-one-pod.yaml"}, gpus: 2,
		note: "class; the container sees both claims' GPUs (device nodes, NVIDIA_VISIBLE_DEVICES, GPULINK_DEVICE_0/1)",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			p := r.waitRunning(ctx, t, r.nsOf(), 1)[0]
			log := p.logs["ctr"]
			if nodes := deviceNodes(log); r.e.devNodes && len(nodes) != 2 {
				t.Errorf("%s: container ctr has device nodes %v, want 2", r.c.files[0], nodes)
			}
			g := gpus(log)
			if len(g) != 2 || g[0] == g[1] {
				t.Errorf("%s: container ctr: NVIDIA_VISIBLE_DEVICES lists %v, want two GPUs", r.c.files[0], g)
			}
			d0, ok0 := envValue(log, "GPULINK_DEVICE_0")
			d1, ok1 := envValue(log, "GPULINK_DEVICE_1")
			if !ok0 || !ok1 || d0 == d1 {
				t.Errorf("%s: container ctr: GPULINK_DEVICE_0=%q GPULINK_DEVICE_1=%q, want two devices", r.c.files[0], d0, d1)
			}
			return ""
		}}
	// gpu-test5: one claim with a time-sliced GPU and an MPS GPU, two
	// containers on each request. gpulink has no time-slicing: the ts
	// request stays a whole GPU, the MPS one becomes a share. Each
	// request's containers get the request's own view of the claim (the
	// kubelet plugin's per-request CDI devices): the ts containers the
	// whole GPU without MPS, the MPS containers the share with its limits.
	test5 := &peerCase{files: []string{q + "gpu-test5.yaml"}, gpus: 2,
		opts: portOptions{dropConfig: dropNVIDIAConfig, shareCapacity: map[string]map[string]any{"mps-gpu": {"memory": "10Gi", "cores": "50"}}},
		note: "rewrite: TimeSlicing config dropped (`ts-gpu` a whole GPU), MPS config → share `{memory: 10Gi, cores: \"50\"}`; each request's containers see their own GPU, only the MPS ones with MPS limits",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			p := r.waitPod(ctx, t, "gpu-test5", "pod0")
			file := r.c.files[0]
			seenBy := map[string]string{}
			for _, ctr := range []string{"ts-ctr0", "ts-ctr1", "mps-ctr0", "mps-ctr1"} {
				g := gpus(p.logs[ctr])
				if len(g) != 1 {
					t.Errorf("%s: container %s sees GPUs %v, want one", file, ctr, g)
					continue
				}
				seenBy[ctr] = g[0]
			}
			if seenBy["ts-ctr0"] != seenBy["ts-ctr1"] || seenBy["mps-ctr0"] != seenBy["mps-ctr1"] || seenBy["ts-ctr0"] == seenBy["mps-ctr0"] {
				t.Errorf("%s: containers see %v, want the ts containers on one GPU and the MPS containers on another", file, seenBy)
			}
			for _, ctr := range []string{"mps-ctr0", "mps-ctr1"} {
				mpsLimits(t, file, p, ctr, "50", 10240)
			}
			noMPS(t, file, seen{pod: p.pod, logs: map[string]string{"ts-ctr0": p.logs["ts-ctr0"], "ts-ctr1": p.logs["ts-ctr1"]}})
			return ""
		}}
	// gpu-test6: four replicas on the A100s with index 0, 2, 4 or 6
	// (time-sliced). Ported to the node's A40s, time-slicing dropped: each
	// replica gets one of those four GPUs.
	test6 := &peerCase{files: []string{q + "gpu-test6.yaml"}, gpus: 4,
		opts: portOptions{dropConfig: dropNVIDIAConfig, attributes: [][2]string{{"a100", "a40"}}},
		note: "CEL (`a100` → `a40`, the node's model), TimeSlicing config dropped; the four replicas get GPUs 0, 2, 4 and 6",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), 4)
			eachSees(t, r.c.files[0], pods, 1)
			distinctPods(t, r.c.files[0], pods)
			for _, p := range pods {
				for ctr, log := range p.logs {
					if d, _ := envValue(log, "GPULINK_DEVICE_0"); !slices.Contains([]string{"gpu-0", "gpu-2", "gpu-4", "gpu-6"}, d) {
						t.Errorf("%s: pod %s container %s got %s, want gpu-0, -2, -4 or -6", r.c.files[0], p.pod.Name, ctr, d)
					}
				}
			}
			return ""
		}}
	return []*peerCase{
		test5,
		test6,
		distinctCase(q+"gpu-test1.yaml", 2, 1, "class; two pods, distinct GPUs"),
		sharedCase(q+"gpu-test2.yaml", 1, "class; two containers of one claim see the same GPU"),
		sharedCase(q+"gpu-test3.yaml", 2, "class; two pods of one ResourceClaim see the same GPU"),
		mps(q+"gpu-test-mps.yaml", "mps-gpu", "rewrite: MPS config → `gpu-share.gpulink.dev` with `{memory: 10Gi, cores: \"50\"}`; both containers see one GPU with those MPS limits"),
		{files: []string{qs + "gpu-test7.yaml"}, gpus: 2, note: "class, v1beta1 → v1; two claims in one pod, distinct GPUs",
			check: func(ctx context.Context, t *testing.T, r *run) string {
				pods := r.waitRunning(ctx, t, r.nsOf(), 1)
				eachSees(t, r.c.files[0], pods, 1)
				distinctContainers(t, r.c.files[0], pods[0])
				return ""
			}},
		test8,
		sharesOneGPU(cs+"memory-sharing.yaml", 2, portOptions{}, "", 0, "class (`gpu-share.gpulink.dev`: a capacity request is a share); both 4Gi replicas on one GPU"),
		unlimited,
		integer(cs+"integer-sharing.yaml", 4),
		fullExt,
		distinctCase(bats+"gpu-simple-full.yaml", 1, 1, "class; one whole GPU"),
		distinctCase(bats+"gpu-2pods-2gpus.yaml", 2, 1, "class; the pods' GPUs differ"),
		sharedCase(bats+"gpu-2pods-1gpu.yaml", 2, "class; the pods of one ResourceClaim see the same GPU"),
		sharedCase(bats+"gpu-1pod-2cnt-1gpu.yaml", 1, "class; two containers see the same GPU"),
		twoClaims,
		stress,
		{files: []string{bats + "gpu-job-rct.yaml"}, gpus: 1, opts: exitAfterPrint, note: "class; both completions of the Job get a GPU",
			check: func(ctx context.Context, t *testing.T, r *run) string {
				eachSees(t, r.c.files[0], r.waitRunning(ctx, t, r.nsOf(), 2), 1)
				return ""
			}},
		distinctCase(bats+"gpu-job-rct-parallel.yaml", 2, 1, "class; two replicas, a claim and a GPU each"),
		restart,
		noMatch,
		sharesOneGPU(bats+"gpu-consumable-shares-memory.yaml", 2, portOptions{}, "", 0, "class (`gpu-share.gpulink.dev`); the two 2Gi pods share one GPU"),
		integer(bats+"gpu-consumable-shares-integer.yaml", 2),
		mps(bats+"gpu-mps.yaml", "gpu", "rewrite: MPS config → `gpu-share.gpulink.dev` with `{memory: 10Gi, cores: \"50\"}`; both containers see one GPU with those MPS limits"),
	}
}
