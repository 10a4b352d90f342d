package topology

import (
	"reflect"
	"testing"
)

func TestIslands(t *testing.T) {
	tests := []struct {
		file string
		want [][]int
	}{
		{"v100-sxm2-8-aliyun-sccgn6.txt", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
		{"p40-pcie-7.txt", [][]int{{0}, {1}, {2}, {3}, {4}, {5}, {6}}},
		{"pcie-nvbridge-8.txt", [][]int{{0, 1}, {2, 3}, {4, 5}, {6, 7}}},
		{"dgx-h100.txt", [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}},
		{"pcie-4.txt", [][]int{{0}, {1}, {2}, {3}}},
		{"synthetic-32.txt", [][]int{
			{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15},
			{16, 17, 18, 19, 20, 21, 22, 23}, {24, 25, 26, 27, 28, 29, 30, 31},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			topo := mustParseFile(t, tt.file)
			got := topo.Islands()
			if !reflect.DeepEqual(got, tt.want) {
				t.Fatalf("Islands() = %v, want %v", got, tt.want)
			}
			for id, isl := range tt.want {
				for _, p := range isl {
					if g := topo.IslandOf(p); g != id {
						t.Errorf("IslandOf(%d) = %d, want %d", p, g, id)
					}
				}
			}
			got[0][0] = 99
			if again := topo.Islands(); again[0][0] == 99 {
				t.Error("Islands result aliases the topology")
			}
		})
	}
}

// TestIslandsAreComponents covers islands that are not cliques and are
// interleaved in position order: GPU0-GPU2-GPU4 chain by NVLink while 0
// and 4 only meet over PCIe.
func TestIslandsAreComponents(t *testing.T) {
	n := 6
	gpus := make([]GPU, n)
	links := make([][]Link, n)
	for i := range n {
		gpus[i] = GPU{Index: i, NUMANode: -1}
		links[i] = make([]Link, n)
		for j := range n {
			if i != j {
				links[i][j] = LinkSYS
			}
		}
	}
	nv := func(a, b int, l Link) { links[a][b], links[b][a] = l, l }
	nv(0, 2, NVLink(2))
	nv(2, 4, NVLink(1))
	nv(3, 5, NVLink(12))
	topo, err := New(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	want := [][]int{{0, 2, 4}, {1}, {3, 5}}
	if got := topo.Islands(); !reflect.DeepEqual(got, want) {
		t.Errorf("Islands() = %v, want %v", got, want)
	}
	wantOf := []int{0, 1, 0, 2, 0, 2}
	for p, w := range wantOf {
		if got := topo.IslandOf(p); got != w {
			t.Errorf("IslandOf(%d) = %d, want %d", p, got, w)
		}
	}
	for _, p := range []int{-1, n} {
		if got := topo.IslandOf(p); got != -1 {
			t.Errorf("IslandOf(%d) = %d, want -1", p, got)
		}
	}
}
