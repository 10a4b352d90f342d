//go:build e2e

package conformance_test

import (
	"context"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/controller/report"
)

// exampleDriverCases run kubernetes-sigs/dra-example-driver's demo specs
// (its device-taint scenarios are in taints_test.go).
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
			if msg := r.event(ctx, t, "admin-access", "pod0", report.ReasonUninterpretable); !strings.Contains(msg, "admin access") {
				t.Errorf("%s: pod0: %s %q does not say why", r.c.files[0], report.ReasonUninterpretable, msg)
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
