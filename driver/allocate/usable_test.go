package allocate

import "testing"

// Usable: whether some shape of the mix could still run on the node as it
// is (the steering taint's "usable" condition in the trace replay).
func TestDemandMixUsable(t *testing.T) {
	one := Host{CPUMilli: 8000, MemoryBytes: 32 * gib}
	two := mustDemand(t, map[DemandShape]int{{GPUs: 2, Host: one}: 1})
	share := mustDemand(t, map[DemandShape]int{{GPUs: 1, ShareMilli: 300, Host: one}: 1})
	// Six of the V100's eight GPUs given out whole, the seventh shared by
	// a share of half its memory.
	used := make([]GPUUsage, 8)
	for p := range 6 {
		used[p].Exclusive = true
	}
	used[6] = GPUUsage{Shares: 1, MemoryBytes: 16 * gib}
	plenty := &Host{CPUMilli: 96000, MemoryBytes: 512 * gib}
	short := &Host{CPUMilli: 4000, MemoryBytes: 512 * gib}
	cases := []struct {
		name  string
		mix   *DemandMix
		usage []GPUUsage
		host  *Host
		want  bool
	}{
		{"idle node, two GPUs fit", two, nil, plenty, true},
		{"one whole GPU left, two needed", two, used, plenty, false},
		{"CPU short for every shape", two, nil, short, false},
		{"host unknown never short", two, nil, nil, true},
		{"a share fits the shared GPU's rest", share, used, plenty, true},
		{"no mix: any unallocated GPU", nil, used, short, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := &NodeState{Name: "n", Topology: v100(t), Usage: c.usage, Host: c.host}
			if got := c.mix.Usable(n); got != c.want {
				t.Errorf("Usable = %v, want %v", got, c.want)
			}
		})
	}
	full := make([]GPUUsage, 8)
	for p := range full {
		full[p].Exclusive = true
	}
	if share.Usable(&NodeState{Name: "full", Topology: v100(t), Usage: full, Host: plenty}) {
		t.Error("a node with every GPU given out is usable")
	}
	if share.Usable(&NodeState{Name: "cpu", Host: plenty}) {
		t.Error("a node without GPUs is usable")
	}
}
