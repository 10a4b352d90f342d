//go:build e2e

package conformance_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/controller"
)

func exampleDriverCases() []*peerCase {
	const d = "dra-example-driver/"
	// The example driver's mock GPUs have model LATEST-GPU-MODEL; the
	// real node's are A40s: the port keeps the selector's meaning (this
	// node's model) with gpulink's attribute name.
	model := [][2]string{{".model == 'LATEST-GPU-MODEL'", ".productName == '" + realProduct + "'"}, {".model ==", ".productName =="}}
	prioritized := &peerCase{files: []string{d + "prioritized-alternatives/prioritized-alternatives.yaml"}, gpus: 2,
		opts: portOptions{attributes: model},
		note: "CEL (`model` → `productName`); pod0 falls through to `older-gpu`, pod1 gets `latest-gpu`",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), 2)
			eachSees(t, r.c.files[0], pods, 1)
			distinctPods(t, r.c.files[0], pods)
			want := map[string]string{"pod0": "gpu/older-gpu", "pod1": "gpu/latest-gpu"}
			claims := r.claims(ctx, t, r.nsOf())
			for _, p := range pods {
				for _, st := range p.pod.Status.ResourceClaimStatuses {
					c := claims[*st.ResourceClaimName]
					if c == nil || c.Status.Allocation == nil || len(c.Status.Allocation.Devices.Results) != 1 {
						t.Errorf("%s: pod %s claim %s: allocation %v", r.c.files[0], p.pod.Name, *st.ResourceClaimName, c)
						continue
					}
					if got := c.Status.Allocation.Devices.Results[0].Request; got != want[p.pod.Name] {
						t.Errorf("%s: pod %s got subrequest %s, want %s", r.c.files[0], p.pod.Name, got, want[p.pod.Name])
					}
				}
			}
			return ""
		}}
	admin := &peerCase{files: []string{d + "admin-access/admin-access.yaml"},
		na:   "admin access: gpulink does not grant admin access to GPUs (docs/security.md); the claim is refused with a ClaimNotAllocatable event",
		note: "class; the refusal event checked",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			if msg := r.event(ctx, t, "admin-access", "pod0", controller.ReasonUninterpretable); !strings.Contains(msg, "admin access") {
				t.Errorf("%s: pod0: %s %q does not say why", r.c.files[0], controller.ReasonUninterpretable, msg)
			}
			return ""
		}}
	initShared := &peerCase{files: []string{d + "initcontainer-shared-gpu/initcontainer-shared-gpu.yaml"}, gpus: 1,
		note: "class; the init container and the container see the same GPU",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.nsOf(), 1)
			if len(pods[0].logs) != 2 {
				t.Errorf("%s: want the logs of init0 and ctr0, have %d", r.c.files[0], len(pods[0].logs))
			}
			sameGPUs(t, r.c.files[0], pods)
			return ""
		}}
	return []*peerCase{
		distinctCase(d+"basic-resourceclaimtemplate/basic-resourceclaimtemplate.yaml", 2, 1, "class; two pods, distinct GPUs"),
		{files: []string{d + "basic-multiple-requests/basic-multiple-requests.yaml"}, gpus: 2, note: "class; two requests, two distinct GPUs",
			check: func(ctx context.Context, t *testing.T, r *run) string {
				eachSees(t, r.c.files[0], r.waitRunning(ctx, t, r.nsOf(), 1), 2)
				return ""
			}},
		sharedCase(d+"basic-shared-claim-across-containers/basic-shared-claim-across-containers.yaml", 1, "class; the containers see the same GPU"),
		sharedCase(d+"basic-shared-claim-across-pods/basic-shared-claim-across-pods.yaml", 2, "class; the pods see the same GPU"),
		initShared,
		{files: []string{d + "cel-selector/cel-selector.yaml"}, gpus: 1, opts: portOptions{attributes: model},
			note: "CEL (`model == 'LATEST-GPU-MODEL'` → `productName == 'NVIDIA A40'`, capacity domain); one GPU of at least 4Gi",
			check: func(ctx context.Context, t *testing.T, r *run) string {
				eachSees(t, r.c.files[0], r.waitRunning(ctx, t, r.nsOf(), 1), 1)
				return ""
			}},
		prioritized,
		sharesOneGPU(d+"gpu-allow-multiple-allocations/gpu-allow-multiple-allocations.yaml", 2,
			portOptions{capacities: map[string]string{"compute": "cores"}}, "20", 16384,
			"class, capacity `compute` → `cores`; both `{16Gi, 20}` claims on one GPU with those MPS limits"),
		admin,
	}
}

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
	sharing := &peerCase{files: []string{h + "use_sharing_card.yaml"}, gpus: 1,
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
			if msg := r.event(ctx, t, r.ns, "gpu-pod", controller.ReasonAllocated); !strings.Contains(msg, "own policy") {
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
	// A defect this suite found: a claim whose MPS shares ask different
	// core percentages on different GPUs (double-gpu-0: 30 % and 60 %)
	// is allocated, and then the kubelet plugin refuses to prepare it
	// (one MPS server applies one thread percentage to all of a claim's
	// GPUs): the pod stays in ContainerCreating with
	// FailedPrepareDynamicResources events instead of being refused or
	// explained before allocation. The case asserts that; once fixed it
	// fails, and the row must become a pass (pod-1 runs, or waits with an
	// event that says why).
	draDemo := &peerCase{files: []string{dra + "setup.yaml", dra + "pod-0.yaml", dra + "pod-1.yaml", dra + "pod-tpl-0.yaml"}, gpus: 4,
		skipKinds: map[string]string{"DeviceClass": "HAMi's own class; the requests use gpu-share.gpulink.dev"},
		opts:      portOptions{dropCPU: true},
		defect:    mpsCoresDefect,
		note:      "class (`gpu-share.gpulink.dev`), the DeviceClass dropped, CPU requests dropped (the test node has 2 cores); pod-0 and pod-tpl-1 run with their MPS limits",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			for _, name := range []string{"pod-0", "pod-tpl-1"} {
				p := r.waitPod(ctx, t, "test-dra", name)
				eachSees(t, r.c.files[0], []seen{p}, 1)
				mpsLimits(t, r.c.files[0], p, "ctr0", "30", 4096)
			}
			msg := r.event(ctx, t, "test-dra", "pod-1", "FailedPrepareDynamicResources")
			if !strings.Contains(msg, "one active thread percentage") {
				t.Errorf("%s: pod-1: FailedPrepareDynamicResources %q, want the MPS thread percentage refusal", r.c.files[0], msg)
			}
			return "pod-1 (double-gpu-0: 30 % cores on one GPU, 60 % on the other) is allocated, then never prepared (FailedPrepareDynamicResources: one MPS thread percentage per claim) instead of refused before allocation"
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

func kubernetesCases() []*peerCase {
	const k = "kubernetes-e2e-dra/test-driver-examples/"
	// withAndWithout: the containers with the claim see its GPU, those
	// without see none; the test driver's opaque config is ignored.
	withAndWithout := func(files []string, n int, note string) *peerCase {
		return &peerCase{files: files, gpus: 1, note: note,
			check: func(ctx context.Context, t *testing.T, r *run) string {
				pods := r.waitRunning(ctx, t, r.ns, n)
				var with []seen
				for _, p := range pods {
					for ctr, log := range p.logs {
						switch {
						case strings.HasPrefix(ctr, "without"):
							if g := gpus(log); len(g) != 0 {
								t.Errorf("%s: pod %s container %s sees %v, want no GPU", files[0], p.pod.Name, ctr, g)
							}
						default:
							with = append(with, seen{pod: p.pod, logs: map[string]string{ctr: log}})
						}
					}
				}
				eachSees(t, files[0], with, 1)
				if n > 1 {
					sameGPUs(t, files[0], with)
				}
				return ""
			}}
	}
	inlineMultiple := &peerCase{files: []string{k + "pod-inline-multiple.yaml"}, gpus: 2,
		note: "class; two claims from one template, a distinct GPU per container; the test driver's config ignored",
		check: func(ctx context.Context, t *testing.T, r *run) string {
			pods := r.waitRunning(ctx, t, r.ns, 1)
			eachSees(t, r.c.files[0], pods, 1)
			distinctContainers(t, r.c.files[0], pods[0])
			return ""
		}}
	external := withAndWithout([]string{k + "pod-external.yaml"}, 1, "class; the container with the claim sees one GPU, the other none; the test driver's config ignored")
	return []*peerCase{
		withAndWithout([]string{k + "pod-inline.yaml"}, 1, "class; the container with the claim sees one GPU, the other none; the test driver's config ignored"),
		inlineMultiple,
		external,
		withAndWithout([]string{k + "pod-shared.yaml"}, 2, "class; both pods' containers with the claim see the same GPU, the others none"),
		{files: []string{k + "resourceclaim.yaml"}, gpus: 1, note: "class; the standalone claim is valid for gpulink (no pod uses it: stays unallocated)",
			check: func(ctx context.Context, t *testing.T, r *run) string {
				if c := r.claims(ctx, t, r.ns)["example"]; c == nil || c.Status.Allocation != nil {
					t.Errorf("%s: claim example: %v, want it created and unallocated", r.c.files[0], c)
				}
				return ""
			}},
	}
}
