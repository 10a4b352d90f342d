//go:build e2e

package conformance_test

import (
	"context"
	"strings"
	"testing"
)

// kubernetesCases run Kubernetes' DRA test-driver examples (the rule
// example is in taints_test.go).
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
