package topology

import (
	"os"
	"strings"
	"testing"
)

func TestEncodeLinkRowKnownRows(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{"v100-sxm2-8-aliyun-sccgn6.txt", []string{
			"X112SS2S", "1X21SSS2", "12X21SSS", "212XS1SS", "SS1SX212", "SSS12X21", "2SSS12X1", "S2SS211X",
		}},
		{"p40-pcie-7.txt", []string{"XPPHHHH", "PXPHHHH", "PPXHHHH", "HHHXPPP", "HHHPXPP", "HHHPPXP", "HHHPPPX"}},
		{"pcie-nvbridge-8.txt", []string{"X4BBSSSS", "4XBBSSSS", "BBX4SSSS", "BB4XSSSS", "SSSSX4NN", "SSSS4XNN", "SSSSNNX4", "SSSSNN4X"}},
		{"dgx-a100.txt", []string{"Xccccccc", "cXcccccc", "ccXccccc", "cccXcccc", "ccccXccc", "cccccXcc", "ccccccXc", "cccccccX"}},
		{"dgx-h100.txt", []string{"Xiiiiiii", "iXiiiiii", "iiXiiiii", "iiiXiiii", "iiiiXiii", "iiiiiXii", "iiiiiiXi", "iiiiiiiX"}},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			topo := mustParseFile(t, tt.file)
			for p, want := range tt.want {
				got, err := EncodeLinkRow(topo, p)
				if err != nil {
					t.Fatalf("EncodeLinkRow(%d): %v", p, err)
				}
				if got != want {
					t.Errorf("EncodeLinkRow(%d) = %q, want %q", p, got, want)
				}
			}
		})
	}
}

func TestLinkRowsRoundTrip(t *testing.T) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	files := 0
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".txt") {
			continue
		}
		files++
		t.Run(e.Name(), func(t *testing.T) {
			topo := mustParseFile(t, e.Name())
			roundTrip(t, topo)
		})
	}
	if files < 9 {
		t.Errorf("found %d fixtures in testdata, want at least 9", files)
	}

	// Every link class, and a node with gaps in its GPU indices.
	var classes []Link
	for l := LinkSYS; l <= LinkPIX; l++ {
		classes = append(classes, l)
	}
	for lanes := 1; lanes <= MaxNVLinkLanes; lanes++ {
		classes = append(classes, NVLink(lanes))
	}
	n := len(classes) + 1
	gpus := make([]GPU, n)
	links := make([][]Link, n)
	for i := range n {
		gpus[i] = GPU{Index: 2*i + 1, NUMANode: -1}
		links[i] = make([]Link, n)
	}
	for i := range n {
		for j := range n {
			if i != j {
				links[i][j] = classes[(i+j)%len(classes)]
			}
		}
	}
	topo, err := New(gpus, links)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("all classes, odd indices", func(t *testing.T) { roundTrip(t, topo) })
}

func roundTrip(t *testing.T, topo *Topology) {
	t.Helper()
	rows := make(map[int]string)
	for p, g := range topo.GPUs {
		row, err := EncodeLinkRow(topo, p)
		if err != nil {
			t.Fatalf("EncodeLinkRow(%d): %v", p, err)
		}
		if len(row) > 64 {
			t.Fatalf("row of GPU%d has %d characters", g.Index, len(row))
		}
		rows[g.Index] = row
	}
	// Reverse the GPU order to check that decoding does not depend on it.
	gpus := make([]GPU, topo.Len())
	for p, g := range topo.GPUs {
		gpus[topo.Len()-1-p] = g
	}
	back, err := DecodeLinkRows(gpus, rows)
	if err != nil {
		t.Fatalf("DecodeLinkRows: %v", err)
	}
	if back.Len() != topo.Len() {
		t.Fatalf("decoded %d GPUs, want %d", back.Len(), topo.Len())
	}
	for p := range topo.Len() {
		if back.GPUs[p] != topo.GPUs[p] {
			t.Errorf("position %d: decoded GPU %+v, want %+v", p, back.GPUs[p], topo.GPUs[p])
		}
		for q := range topo.Len() {
			if back.Link(p, q) != topo.Link(p, q) {
				t.Errorf("link %d-%d: decoded %s, want %s", p, q, back.Link(p, q), topo.Link(p, q))
			}
		}
	}
}

func TestEncodeLinkRowErrors(t *testing.T) {
	small := mustParseFile(t, "pcie-4.txt")
	gpus := []GPU{{Index: 0, NUMANode: -1}, {Index: 70, NUMANode: -1}}
	wide, err := New(gpus, [][]Link{{LinkNone, LinkSYS}, {LinkSYS, LinkNone}})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		topo *Topology
		p    int
		want string
	}{
		{"index beyond the attribute", wide, 0, "GPU index 70 does not fit the 64-character links attribute"},
		{"negative position", small, -1, "position -1 out of range [0, 4)"},
		{"position past the end", small, 4, "position 4 out of range [0, 4)"},
		{"nil topology", nil, 0, "nil topology"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			row, err := EncodeLinkRow(tt.topo, tt.p)
			if err == nil {
				t.Fatalf("EncodeLinkRow = %q, want error containing %q", row, tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func TestDecodeLinkRowsErrors(t *testing.T) {
	// GPUs 0, 1 and 3: index 2 fell off the bus.
	gpus := []GPU{{Index: 0}, {Index: 1}, {Index: 3}}
	good := map[int]string{0: "X4.S", 1: "4X.S", 3: "SS.X"}
	with := func(idx int, row string) map[int]string {
		m := make(map[int]string)
		for k, v := range good {
			m[k] = v
		}
		m[idx] = row
		return m
	}
	without := func(idx int) map[int]string {
		m := with(idx, "")
		delete(m, idx)
		return m
	}
	if _, err := DecodeLinkRows(gpus, good); err != nil {
		t.Fatalf("valid rows rejected: %v", err)
	}
	tests := []struct {
		name string
		gpus []GPU
		rows map[int]string
		want string
	}{
		{"no GPUs", nil, good, "no GPUs"},
		{"missing row", gpus, without(1), "GPU 1 has no links row"},
		{"row for unknown GPU", gpus, with(2, "SSXS"), "row for GPU index 2, which is not among the node's GPUs"},
		{"short row", gpus, with(1, "4X."), `GPU 1: row "4X." has 3 characters, want 4`},
		{"long row", gpus, with(1, "4X.SS"), `GPU 1: row "4X.SS" has 5 characters, want 4`},
		{"self not X", gpus, with(1, "44.S"), `GPU 1: character 1 is '4', want 'X' for the GPU itself`},
		{"link where no GPU exists", gpus, with(0, "X4SS"), `GPU 0: character 2 is 'S', want '.' because the node has no GPU 2`},
		{"absent marker for existing GPU", gpus, with(0, "X..S"), `GPU 0: character 1 is '.', want a link class`},
		{"X off the diagonal", gpus, with(0, "XX.S"), `GPU 0: character 1 is 'X', want a link class`},
		{"unknown character", gpus, with(3, "SZ.X"), `GPU 3: character 1 is 'Z', want a link class`},
		{"NV19 does not exist", gpus, with(3, "Sj.X"), `GPU 3: character 1 is 'j', want a link class`},
		{"lower-case PCIe class", gpus, with(3, "sS.X"), `GPU 3: character 0 is 's', want a link class`},
		{"asymmetric", gpus, with(3, "SP.X"), `asymmetric rows: GPU 1 has 'S' (SYS) for GPU 3 but GPU 3 has 'P' (PIX) for GPU 1`},
		{"duplicate GPU", []GPU{{Index: 0}, {Index: 0}}, map[int]string{0: "X"}, "duplicate GPU index 0"},
		{"negative index", []GPU{{Index: -1}}, map[int]string{-1: "X"}, "GPU index -1 is negative"},
		{"index beyond the attribute", []GPU{{Index: 0}, {Index: 64}}, map[int]string{0: "X", 64: "X"}, "GPU index 64 does not fit the 64-character links attribute"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo, err := DecodeLinkRows(tt.gpus, tt.rows)
			if err == nil {
				t.Fatalf("DecodeLinkRows succeeded with %d GPUs, want error containing %q", topo.Len(), tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}
