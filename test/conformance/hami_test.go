//go:build e2e

package conformance_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/controller/report"
)

// hamiCases run HAMi's examples/nvidia pods unchanged (gpulink's webhook
// translates their resources and annotations) and its DRA driver demo.
func hamiCases() []*peerCase {
	const h, dra = "hami/examples-nvidia/", "hami/k8s-dra-driver-demo/"
	pod := distinctCase
	share := &peerCase{files: []string{h + "default_use.yaml"}, gpus: 1, note: "unchanged: one GPU with MPS limits 3000 MiB, 30 %",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.ns, 1)
			eachSees(t, r.c.files[0], pods, 1)
			mpsLimits(t, r.c.files[0], pods[0], "ubuntu-container", "30", 3000)
			return ""
		}}
	// alone: beside another case's share, the first of the two pods to be
	// decided may be packed onto that share's GPU, and the other (whose
	// cores no longer fit there) takes a GPU of its own. Alone, whichever
	// comes first takes an empty GPU and the other fills it exactly.
	sharing := &peerCase{files: []string{h + "use_sharing_card.yaml"}, gpus: 1, alone: true,
		note: "unchanged: the 40 %/60 % pods share one GPU (issue 18 defect 1, fixed)",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.ns, 2)
			eachSees(t, r.c.files[0], pods, 1)
			sameGPUs(t, r.c.files[0], pods)
			return ""
		}}
	waits := func(file, note string) *peerCase {
		return &peerCase{files: []string{file}, note: note,
			check: func(ctx context.Context, t *testing.T, r *run) string {
				r.waitWaiting(ctx, t, r.ns, "gpu-pod")
				return ""
			}}
	}
	// Issue 18 defect 2 (fixed): one claim's shares on several GPUs were
	// placed one by one, ignoring links: with shares on gpu-0 and gpu-5
	// the two 50 % shares took that SYS pair. The case recreates that
	// state (CEL selectors on the index) and wants an NVLink pair.
	fraction := &peerCase{files: []string{h + "use_memory_fraction.yaml"}, gpus: 4, alone: true,
		applyLater: map[string]bool{h + "use_memory_fraction.yaml": true},
		note:       "unchanged: two 50 % shares on an NVLink pair, also with shares already on gpu-0 and gpu-5 (issue 18 defect 2, fixed)",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			r.occupy(ctx, t, 0)
			r.occupy(ctx, t, 5)
			r.applyFile(ctx, t, r.c.files[0])
			p := r.waitPod(ctx, t, r.ns, "gpu-pod")
			eachSees(t, r.c.files[0], []seen{p}, 2)
			mpsLimits(t, r.c.files[0], p, "ubuntu-container", "30", 24576)
			link := r.weakestLink(ctx, t, gpus(p.logs["ubuntu-container"]))
			if !link.IsNVLink() {
				t.Errorf("%s: the shares' GPUs are joined by %s, want an NVLink pair", r.c.files[0], link)
			}
			return ""
		}}
	// Issue 18 defect 4 (fixed): the per-pod policies were refused; they
	// now decide the pod's placement, named in the allocation event.
	policy := &peerCase{files: []string{h + "specify_scheduling_policy.yaml"}, gpus: 1,
		note: "unchanged: the pod runs on one GPU, its allocation event names its own policy (issue 18 defect 4, fixed)",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			eachSees(t, r.c.files[0], r.waitRunning(ctx, t, r.ns, 1), 1)
			if msg := r.event(ctx, t, r.ns, "gpu-pod", report.ReasonAllocated); !strings.Contains(msg, "own policy") {
				t.Errorf("%s: allocation event %q does not name the pod's own policy", r.c.files[0], msg)
			}
			return ""
		}}
	exclusive := &peerCase{files: []string{h + "use_exclusive_card.yaml"}, gpus: 2,
		note: "unchanged: two GPUs, each a share of all its memory and cores (MPS limits 100 %, 49152 MiB), so no other share fits",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.ns, 1)
			eachSees(t, r.c.files[0], pods, 2)
			mpsLimits(t, r.c.files[0], pods[0], "ubuntu-container", "100", 49152)
			return ""
		}}
	// double-gpu-0 asks two MPS shares of one claim, 30 % and 60 % of the
	// cores. The claim's one MPS server has one active thread percentage,
	// so the controller places both on one GPU (90 % of it, 12 GiB), where
	// HAMi's own DRA driver leaves the claim pending (its issue #24).
	draDemo := &peerCase{files: []string{dra + "setup.yaml", dra + "pod-0.yaml", dra + "pod-1.yaml", dra + "pod-tpl-0.yaml"}, gpus: 4,
		skipKinds: map[string]string{"DeviceClass": "HAMi's own class; the requests use gpu-share.gpulink.dev"},
		opts:      portOptions{dropCPU: true},
		note:      "class (`gpu-share.gpulink.dev`), the DeviceClass dropped, CPU requests dropped (the test node has 2 cores); pod-0 and pod-tpl-1 run with their MPS limits, pod-1 (double-gpu-0: 30 % and 60 %) with both shares on one GPU, 90 % and 12 GiB",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			for _, name := range []string{"pod-0", "pod-tpl-1"} {
				p := r.waitPod(ctx, t, "test-dra", name)
				eachSees(t, r.c.files[0], []seen{p}, 1)
				mpsLimits(t, r.c.files[0], p, "ctr0", "30", 4096)
			}
			p := r.waitPod(ctx, t, "test-dra", "pod-1")
			eachSees(t, r.c.files[0], []seen{p}, 1)
			mpsLimits(t, r.c.files[0], p, "ctr0", "90", 12288)
			return ""
		}}
	return []*peerCase{
		share,
		pod(h+"default_use_legacy.yaml", 1, 2, "unchanged: two whole GPUs"),
		pod(h+"use_as_normal.yaml", 2, 1, "unchanged: two pods, a whole GPU each"),
		exclusive,
		sharing,
		{files: []string{h + "example.yaml"}, gpus: 1, note: "unchanged: the Deployment's pod gets one GPU limited to 3000 MiB",
			check: func(ctx context.Context, t *testing.T, r *run) string {
				pods := r.waitRunning(ctx, t, r.ns, 1)
				eachSees(t, r.c.files[0], pods, 1)
				mpsLimits(t, r.c.files[0], pods[0], "cuda-sample-vector-add", "", 3000)
				return ""
			}},
		waits(h+"specify_card_type_to_use.yaml", "unchanged: no A100 or V100 on the node, the pod waits with gpulink's WaitingForGPUs event"),
		pod(h+"specify_card_type_not_use.yaml", 1, 2, "unchanged: the A40s are not excluded, two GPUs"),
		waits(h+"specify_uuid_to_use.yaml", "unchanged: the UUIDs are not on the node, the pod waits with gpulink's WaitingForGPUs event"),
		pod(h+"specify_uuid_not_use.yaml", 1, 2, "unchanged: two GPUs, none excluded"),
		fraction,
		policy,
		draDemo,
	}
}
