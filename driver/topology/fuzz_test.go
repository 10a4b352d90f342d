package topology

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FuzzParse checks that Parse never panics and that whatever it accepts is
// a consistent topology that survives the links-attribute round trip.
func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.txt"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		data, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(data))
	}
	f.Add("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV1\t X \n")
	f.Add("        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\nGPU0     X      NV4     0-7     0               N/A\nGPU1    NV4      X      8-15    1               N/A\n")
	f.Fuzz(func(t *testing.T, input string) {
		topo, err := Parse(strings.NewReader(input))
		if err != nil {
			if topo != nil {
				t.Fatalf("Parse returned a topology and an error: %v", err)
			}
			return
		}
		n := topo.Len()
		if n == 0 {
			t.Fatal("Parse accepted a topology without GPUs")
		}
		rows := make(map[int]string, n)
		for p, g := range topo.GPUs {
			if p > 0 && topo.GPUs[p-1].Index >= g.Index {
				t.Fatalf("GPU indices not ascending: %d then %d", topo.GPUs[p-1].Index, g.Index)
			}
			for q := range n {
				l := topo.Link(p, q)
				if (p == q) != (l == LinkNone) || l != topo.Link(q, p) {
					t.Fatalf("link %d-%d = %s is inconsistent", p, q, l)
				}
			}
			row, err := EncodeLinkRow(topo, p)
			if err != nil {
				if g.Index < maxLinksLen && topo.GPUs[n-1].Index < maxLinksLen {
					t.Fatalf("EncodeLinkRow(%d): %v", p, err)
				}
				return
			}
			rows[g.Index] = row
		}
		back, err := DecodeLinkRows(topo.GPUs, rows)
		if err != nil {
			t.Fatalf("DecodeLinkRows of encoded rows: %v", err)
		}
		for p := range n {
			for q := range n {
				if back.Link(p, q) != topo.Link(p, q) {
					t.Fatalf("round trip changed link %d-%d", p, q)
				}
			}
		}
	})
}
