package topology

import "testing"

func TestWeakestLinkAndLinkSum(t *testing.T) {
	v100 := mustParseFile(t, "v100-sxm2-8-aliyun-sccgn6.txt")
	p40 := mustParseFile(t, "p40-pcie-7.txt")
	tests := []struct {
		name      string
		topo      *Topology
		positions []int
		weakest   Link
		sum       int
	}{
		{"empty set", v100, nil, LinkNone, 0},
		{"one GPU", v100, []int{3}, LinkNone, 0},
		{"repeated GPU is no pair", v100, []int{3, 3}, LinkNone, 0},
		{"NV2 pair", v100, []int{0, 3}, NVLink(2), int(NVLink(2))},
		{"NVLink quad", v100, []int{0, 1, 2, 3}, NVLink(1), 3*int(NVLink(1)) + 3*int(NVLink(2))},
		{"quad across the mesh", v100, []int{0, 1, 4, 5}, LinkSYS, int(NVLink(1)) + int(NVLink(2)) + 4*int(LinkSYS)},
		{"order does not matter", v100, []int{5, 1, 4, 0}, LinkSYS, int(NVLink(1)) + int(NVLink(2)) + 4*int(LinkSYS)},
		{"PIX triple", p40, []int{0, 1, 2}, LinkPIX, 3 * int(LinkPIX)},
		{"across switches", p40, []int{2, 3}, LinkPHB, int(LinkPHB)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.topo.WeakestLink(tt.positions); got != tt.weakest {
				t.Errorf("WeakestLink(%v) = %s, want %s", tt.positions, got, tt.weakest)
			}
			if got := tt.topo.LinkSum(tt.positions); got != tt.sum {
				t.Errorf("LinkSum(%v) = %d, want %d", tt.positions, got, tt.sum)
			}
		})
	}
}
