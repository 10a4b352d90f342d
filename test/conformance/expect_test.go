//go:build e2e

package conformance_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// The expectations the peer-specs README states, checked from what the
// containers print (test/images/workload) and from the claims.

// eachSees checks that every container of every pod sees n GPUs.
func eachSees(t *testing.T, file string, pods []seen, n int) {
	t.Helper()
	for _, p := range pods {
		for ctr, log := range p.logs {
			if got := gpus(log); len(got) != n {
				t.Errorf("%s: pod %s container %s sees %d GPUs %v, want %d", file, p.pod.Name, ctr, len(got), got, n)
			}
		}
	}
}

// distinctPods checks that no two pods see a GPU in common.
func distinctPods(t *testing.T, file string, pods []seen) {
	t.Helper()
	owner := map[string]string{}
	for _, p := range pods {
		for _, log := range p.logs {
			for _, g := range gpus(log) {
				if o, ok := owner[g]; ok && o != p.pod.Name {
					t.Errorf("%s: pods %s and %s both see GPU %s, want distinct GPUs", file, o, p.pod.Name, g)
				}
				owner[g] = p.pod.Name
			}
		}
	}
}

// distinctContainers checks that the containers of one pod see disjoint GPUs.
func distinctContainers(t *testing.T, file string, p seen) {
	t.Helper()
	owner := map[string]string{}
	for ctr, log := range p.logs {
		for _, g := range gpus(log) {
			if o, ok := owner[g]; ok {
				t.Errorf("%s: pod %s containers %s and %s both see GPU %s, want distinct GPUs", file, p.pod.Name, o, ctr, g)
			}
			owner[g] = ctr
		}
	}
}

// sameGPUs checks that every container of every pod sees the same
// non-empty set of GPUs, and returns it.
func sameGPUs(t *testing.T, file string, pods []seen) []string {
	t.Helper()
	var want []string
	for _, p := range pods {
		for ctr, log := range p.logs {
			got := gpus(log)
			if len(got) == 0 {
				t.Errorf("%s: pod %s container %s sees no GPU", file, p.pod.Name, ctr)
			}
			if want == nil {
				want = got
			} else if !slices.Equal(got, want) {
				t.Errorf("%s: pod %s container %s sees %v, another container %v; want the same GPU", file, p.pod.Name, ctr, got, want)
			}
		}
	}
	return want
}

// mpsLimits checks a container's MPS limits: the thread percentage (unless
// "": the class's default) and the first GPU's pinned memory in MiB
// (unless negative: the class's default).
func mpsLimits(t *testing.T, file string, p seen, ctr, cores string, memMiB int) {
	t.Helper()
	log := p.logs[ctr]
	if got, _ := envValue(log, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); cores != "" && got != cores {
		t.Errorf("%s: pod %s container %s: CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=%q, want %q", file, p.pod.Name, ctr, got, cores)
	}
	if memMiB < 0 {
		return // the class's default memory
	}
	got, _ := envValue(log, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")
	if want := fmt.Sprintf("0=%dM", memMiB); !strings.HasPrefix(got, want) {
		t.Errorf("%s: pod %s container %s: CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want %s", file, p.pod.Name, ctr, got, want)
	}
}

// deviceNodes returns the GPU device nodes (/dev/nvidia<minor>) a
// container sees.
func deviceNodes(log string) []string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if d, ok := strings.CutPrefix(strings.TrimRight(l, "\r"), "DEV /dev/nvidia"); ok && d != "" && strings.Trim(d, "0123456789") == "" {
			out = append(out, "/dev/nvidia"+d)
		}
	}
	return out
}

// noMPS checks that a container got whole GPUs, without share limits.
func noMPS(t *testing.T, file string, p seen) {
	t.Helper()
	for ctr, log := range p.logs {
		if v, ok := envValue(log, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"); ok {
			t.Errorf("%s: pod %s container %s has an MPS limit %s, want whole GPUs", file, p.pod.Name, ctr, v)
		}
	}
}

// weakestLink returns the slowest link between the GPUs a container sees
// (by UUID), from the node's published topology.
func (r *run) weakestLink(ctx context.Context, t *testing.T, uuids []string) topology.Link {
	t.Helper()
	nodes, err := gpuview.Nodes(ctx, r.e.client)
	if err != nil {
		t.Fatal(err)
	}
	node, ok := nodes[r.e.node]
	if !ok {
		t.Fatalf("%s: node %s publishes no GPUs", r.c.files[0], r.e.node)
	}
	var devices []string
	for _, g := range node.GPUs {
		if slices.Contains(uuids, g.UUID) {
			devices = append(devices, g.Device)
		}
	}
	if len(devices) != len(uuids) {
		t.Fatalf("%s: GPUs %v are not all published by %s (%v)", r.c.files[0], uuids, r.e.node, devices)
	}
	link, err := node.Weakest(devices)
	if err != nil {
		t.Fatal(err)
	}
	return link
}
