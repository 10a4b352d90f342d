package allocate

import (
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// TestShareSetWeakestLinkFirstThenPack: HAMi's nvidia.com/gpu: 2 with a
// memory share on the aliyun V100 box (hybrid cube mesh). A share already
// sits on GPU 5. Placed one by one, the second share went to a fresh GPU
// chosen for itself, joined to GPU 5 by SYS while NVLink pairs were free
// (issue 18, defect 2). As a set: the strongest weakest link first, then
// packed onto the shared GPU (binpack) or away from it (spread).
func TestShareSetWeakestLinkFirstThenPack(t *testing.T) {
	topo := fixture(t, "v100-sxm2-8-aliyun-sccgn6.txt", 16)
	usage := make([]GPUUsage, topo.Len())
	usage[5] = GPUUsage{Shares: 1, MemoryBytes: 4 * gib, Cores: 25}
	n := &NodeState{Name: "v100", Topology: topo, Usage: usage}
	share := &ShareRequest{MemoryBytes: 8 * gib, Cores: 50}
	binpack := Policy{Node: Binpack, GPU: Binpack}

	got, err := ShareSet(n, Request{Share: share}, 2, binpack)
	if err != nil {
		t.Fatal(err)
	}
	// GPU 5's NV2 partners are 4 and 6; the lower wins the tie.
	if !slices.Equal(got, []int{4, 5}) {
		t.Errorf("binpack: %v (weakest link %s), want [4 5]: an NV2 pair that packs onto the shared GPU 5", got, topo.WeakestLink(got))
	}

	got, err = ShareSet(n, Request{Share: share}, 2, Policy{Node: Binpack, GPU: Spread})
	if err != nil {
		t.Fatal(err)
	}
	if w := topo.WeakestLink(got); w != topology.NVLink(2) || slices.Contains(got, 5) {
		t.Errorf("spread: %v (weakest %s), want an NV2 pair away from the shared GPU 5", got, w)
	}

	// Four shares: the best weakest link a 4-set of this mesh has is NV1.
	got, err = ShareSet(n, Request{Share: share}, 4, binpack)
	if err != nil {
		t.Fatal(err)
	}
	if w := topo.WeakestLink(got); w != topology.NVLink(1) || !slices.Contains(got, 5) {
		t.Errorf("4 shares: %v (weakest %s), want an all-NVLink set with GPU 5", got, w)
	}

	// A required link is honoured, and refused by name when no set has it.
	elig := []bool{true, false, false, false, true, true, false, false}
	got, err = ShareSet(n, Request{Share: share, Eligible: elig, RequiredLink: topology.NVLink(2)}, 2, binpack)
	if err != nil || !slices.Equal(got, []int{4, 5}) {
		t.Errorf("required NV2 among GPUs 0, 4, 5: %v, %v; want [4 5]", got, err)
	}
	elig = []bool{true, false, false, false, true, false, false, false}
	_, err = ShareSet(n, Request{Share: share, Eligible: elig, RequiredLink: topology.NVLink(1)}, 2, binpack)
	var unsat *UnsatisfiableError
	if !errors.As(err, &unsat) || !strings.Contains(err.Error(), "NV1 or better") {
		t.Errorf("required NV1 between GPUs 0 and 4 (SYS): %v", err)
	}

	// Not enough GPUs that fit: the reason counts why the others do not.
	full := slices.Clone(usage)
	for p := range full {
		if p != 2 {
			full[p] = GPUUsage{Exclusive: true}
		}
	}
	_, err = ShareSet(&NodeState{Name: "v100", Topology: topo, Usage: full}, Request{Share: share}, 2, binpack)
	if !errors.As(err, &unsat) || !strings.Contains(err.Error(), "need 2 GPUs") || !strings.Contains(err.Error(), "given out whole") {
		t.Errorf("one GPU free: %v", err)
	}
}

// TestShareSetMatchesBruteForce: on every fixture and random usage, the
// set's weakest link is the best any set of fitting GPUs has.
func TestShareSetMatchesBruteForce(t *testing.T) {
	files := []string{"v100-sxm2-8-aliyun-sccgn6.txt", "dgx1-v100.txt", "p40-pcie-7.txt", "pcie-switch-8.txt", "dgx-a100.txt", "pcie-plx-10.txt"}
	rng := rand.New(rand.NewPCG(1, 2))
	share := &ShareRequest{MemoryBytes: 6 * gib, Cores: 30}
	for _, f := range files {
		topo := fixture(t, f, 16)
		for trial := range 40 {
			usage := make([]GPUUsage, topo.Len())
			for p := range usage {
				switch rng.IntN(4) {
				case 0:
					usage[p] = GPUUsage{Exclusive: true}
				case 1:
					usage[p] = GPUUsage{Shares: 1, MemoryBytes: int64(rng.IntN(16)) * gib, Cores: int64(rng.IntN(100))}
				}
			}
			n := &NodeState{Name: f, Topology: topo, Usage: usage}
			var fitting []int
			for p := range usage {
				if n.shareFit(p, share) == fits {
					fitting = append(fitting, p)
				}
			}
			for count := 2; count <= 3; count++ {
				got, err := ShareSet(n, Request{Share: share}, count, Policy{Node: Binpack, GPU: Binpack})
				if len(fitting) < count {
					if err == nil {
						t.Errorf("%s trial %d: %d shares placed on %v with %d fitting GPUs", f, trial, count, got, len(fitting))
					}
					continue
				}
				if err != nil {
					t.Fatalf("%s trial %d: %v", f, trial, err)
				}
				best := topology.LinkNone
				forEachSubset(fitting, count, func(s []int) {
					if w := topo.WeakestLink(s); best == topology.LinkNone || w > best {
						best = w
					}
				})
				if len(got) != count || topo.WeakestLink(got) != best {
					t.Errorf("%s trial %d count %d: %v (weakest %s), best possible %s", f, trial, count, got, topo.WeakestLink(got), best)
				}
				for _, p := range got {
					if !slices.Contains(fitting, p) {
						t.Errorf("%s trial %d: GPU %d does not fit the share", f, trial, p)
					}
				}
			}
		}
	}
}

func forEachSubset(items []int, k int, fn func([]int)) {
	var cur []int
	var rec func(start int)
	rec = func(start int) {
		if len(cur) == k {
			fn(cur)
			return
		}
		for i := start; i < len(items); i++ {
			cur = append(cur, items[i])
			rec(i + 1)
			cur = cur[:len(cur)-1]
		}
	}
	rec(0)
}
