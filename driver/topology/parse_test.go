package topology

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
)

// matrixOf renders a topology as rows of space-separated link classes
// ("X" on the diagonal), the notation the expectations below are written in.
func matrixOf(t *Topology) []string {
	rows := make([]string, t.Len())
	for p := range t.Len() {
		cells := make([]string, t.Len())
		for q := range t.Len() {
			if p == q {
				cells[q] = "X"
			} else {
				cells[q] = t.Link(p, q).String()
			}
		}
		rows[p] = strings.Join(cells, " ")
	}
	return rows
}

// matrixFromFunc builds the expected rows of an n-GPU matrix from a rule.
func matrixFromFunc(n int, link func(i, j int) string) []string {
	rows := make([]string, n)
	for i := range n {
		cells := make([]string, n)
		for j := range n {
			if i == j {
				cells[j] = "X"
			} else {
				cells[j] = link(i, j)
			}
		}
		rows[i] = strings.Join(cells, " ")
	}
	return rows
}

func TestParseFixtures(t *testing.T) {
	tests := []struct {
		file     string
		matrix   []string
		numa     []int
		cpu      []string
		nvIsland [][]int
	}{
		{
			file: "p40-pcie-7.txt",
			matrix: []string{
				"X PIX PIX PHB PHB PHB PHB",
				"PIX X PIX PHB PHB PHB PHB",
				"PIX PIX X PHB PHB PHB PHB",
				"PHB PHB PHB X PIX PIX PIX",
				"PHB PHB PHB PIX X PIX PIX",
				"PHB PHB PHB PIX PIX X PIX",
				"PHB PHB PHB PIX PIX PIX X",
			},
			numa: []int{0, 0, 0, 0, 0, 0, 0},
			cpu:  []string{"0-13,28-41", "0-13,28-41", "0-13,28-41", "0-13,28-41", "0-13,28-41", "0-13,28-41", "0-13,28-41"},
		},
		{
			file: "v100-sxm2-8-aliyun-sccgn6.txt",
			matrix: []string{
				"X NV1 NV1 NV2 SYS SYS NV2 SYS",
				"NV1 X NV2 NV1 SYS SYS SYS NV2",
				"NV1 NV2 X NV2 NV1 SYS SYS SYS",
				"NV2 NV1 NV2 X SYS NV1 SYS SYS",
				"SYS SYS NV1 SYS X NV2 NV1 NV2",
				"SYS SYS SYS NV1 NV2 X NV2 NV1",
				"NV2 SYS SYS SYS NV1 NV2 X NV1",
				"SYS NV2 SYS SYS NV2 NV1 NV1 X",
			},
			// No NUMA Affinity column: unknown.
			numa: []int{-1, -1, -1, -1, -1, -1, -1, -1},
			cpu:  []string{"0-95", "0-95", "0-95", "0-95", "0-95", "0-95", "0-95", "0-95"},
		},
		{
			file:   "dgx-a100.txt",
			matrix: matrixFromFunc(8, func(i, j int) string { return "NV12" }),
			numa:   []int{3, 3, 1, 1, 7, 7, 5, 5},
			cpu:    []string{"48-63,176-191", "48-63,176-191", "16-31,144-159", "16-31,144-159", "112-127,240-255", "112-127,240-255", "80-95,208-223", "80-95,208-223"},
		},
		{
			file:   "dgx-h100.txt",
			matrix: matrixFromFunc(8, func(i, j int) string { return "NV18" }),
			numa:   []int{0, 0, 0, 0, 1, 1, 1, 1},
			cpu:    []string{"0-55,112-167", "0-55,112-167", "0-55,112-167", "0-55,112-167", "56-111,168-223", "56-111,168-223", "56-111,168-223", "56-111,168-223"},
		},
		{
			file: "pcie-nvbridge-8.txt",
			matrix: []string{
				"X NV4 PXB PXB SYS SYS SYS SYS",
				"NV4 X PXB PXB SYS SYS SYS SYS",
				"PXB PXB X NV4 SYS SYS SYS SYS",
				"PXB PXB NV4 X SYS SYS SYS SYS",
				"SYS SYS SYS SYS X NV4 NODE NODE",
				"SYS SYS SYS SYS NV4 X NODE NODE",
				"SYS SYS SYS SYS NODE NODE X NV4",
				"SYS SYS SYS SYS NODE NODE NV4 X",
			},
			numa: []int{0, 0, 0, 0, 1, 1, 1, 1},
			cpu:  []string{"0-31,64-95", "0-31,64-95", "0-31,64-95", "0-31,64-95", "32-63,96-127", "32-63,96-127", "32-63,96-127", "32-63,96-127"},
		},
		{
			file:   "dgx2-16.txt",
			matrix: matrixFromFunc(16, func(i, j int) string { return "NV6" }),
			numa:   []int{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
		},
		{
			file: "pcie-16.txt",
			matrix: matrixFromFunc(16, func(i, j int) string {
				switch {
				case i/4 == j/4:
					return "PIX"
				case i/8 == j/8:
					return "NODE"
				}
				return "SYS"
			}),
			numa: []int{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
		},
		{
			file: "pcie-4.txt",
			matrix: []string{
				"X PIX SYS SYS",
				"PIX X SYS SYS",
				"SYS SYS X PIX",
				"SYS SYS PIX X",
			},
			numa: []int{0, 0, 1, 1},
			cpu:  []string{"0-15,32-47", "0-15,32-47", "16-31,48-63", "16-31,48-63"},
		},
		{
			file: "synthetic-32.txt",
			matrix: matrixFromFunc(32, func(i, j int) string {
				cube := [8]string{
					"X NV1 NV1 NV2 SYS SYS NV2 SYS",
					"NV1 X NV2 NV1 SYS SYS SYS NV2",
					"NV1 NV2 X NV2 NV1 SYS SYS SYS",
					"NV2 NV1 NV2 X SYS NV1 SYS SYS",
					"SYS SYS NV1 SYS X NV2 NV1 NV2",
					"SYS SYS SYS NV1 NV2 X NV2 NV1",
					"NV2 SYS SYS SYS NV1 NV2 X NV1",
					"SYS NV2 SYS SYS NV2 NV1 NV1 X",
				}
				switch {
				case i/8 == j/8:
					if c := strings.Fields(cube[i%8])[j%8]; c != "SYS" {
						return c
					}
					return "PXB"
				case i/16 == j/16:
					return "NODE"
				}
				return "SYS"
			}),
		},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			topo, err := ParseFile(filepath.Join("testdata", tt.file))
			if err != nil {
				t.Fatalf("ParseFile: %v", err)
			}
			if got := matrixOf(topo); !reflect.DeepEqual(got, tt.matrix) {
				t.Errorf("matrix:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tt.matrix, "\n"))
			}
			for p, g := range topo.GPUs {
				if g.Index != p {
					t.Errorf("position %d has index %d, want %d", p, g.Index, p)
				}
				if tt.numa != nil && g.NUMANode != tt.numa[p] {
					t.Errorf("GPU%d NUMANode = %d, want %d", g.Index, g.NUMANode, tt.numa[p])
				}
				if tt.cpu != nil && g.CPUAffinity != tt.cpu[p] {
					t.Errorf("GPU%d CPUAffinity = %q, want %q", g.Index, g.CPUAffinity, tt.cpu[p])
				}
			}
		})
	}
}

func TestParseLayouts(t *testing.T) {
	tests := []struct {
		name  string
		input string
		want  []string
		numa  []int
		cpu   []string
		index []int
	}{
		{
			name:  "runs of spaces, attribute headers split into words",
			input: "        GPU0    GPU1    CPU Affinity    NUMA Affinity   GPU NUMA ID\nGPU0     X      NV4     0-7     0               N/A\nGPU1    NV4      X      8-15    1               N/A\n",
			want:  []string{"X NV4", "NV4 X"},
			numa:  []int{0, 1},
			cpu:   []string{"0-7", "8-15"},
		},
		{
			name:  "terminal underline and CRLF line ends",
			input: "\t\x1b[4mGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\x1b[0m\r\nGPU0\t X \tSYS\t0-3\t0\r\nGPU1\tSYS\t X \t4-7\t1\r\n\r\nLegend:\r\n",
			want:  []string{"X SYS", "SYS X"},
			numa:  []int{0, 1},
			cpu:   []string{"0-3", "4-7"},
		},
		{
			name:  "GPU NUMA ID is the fallback for an unknown NUMA affinity",
			input: "\tGPU0\tGPU1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\nGPU0\t X \tNV18\tN/A\tN/A\t2\nGPU1\tNV18\t X \t0-71\t0\t3\n",
			want:  []string{"X NV18", "NV18 X"},
			numa:  []int{2, 0},
			cpu:   []string{"", "0-71"},
		},
		{
			name:  "NUMA affinity spanning nodes has no single node",
			input: "\tGPU0\tGPU1\tNUMA Affinity\nGPU0\t X \tPHB\t0-1\nGPU1\tPHB\t X \t0,1\n",
			want:  []string{"X PHB", "PHB X"},
			numa:  []int{-1, -1},
			cpu:   []string{"", ""},
		},
		{
			name:  "missing GPU index, rows out of order, SOC spelling, NIC legend",
			input: "\tGPU0\tGPU2\tGPU3\tNIC0\tCPU Affinity\nGPU3\tSOC\tPIX\t X \tSYS\t1\nGPU0\t X \tSOC\tSOC\tPIX\t0\nNIC0\tPIX\tSYS\tSYS\t X \nGPU2\tSOC\t X \tPIX\tSYS\t1\n\nLegend:\n\n  X = Self\n\nNIC Legend:\n\n  NIC0: mlx5_0\n",
			want:  []string{"X SYS SYS", "SYS X PIX", "SYS PIX X"},
			numa:  []int{-1, -1, -1},
			cpu:   []string{"0", "1", "1"},
			index: []int{0, 2, 3},
		},
		{
			name:  "header columns out of index order",
			input: "\tGPU1\tGPU0\nGPU1\t X \tNV2\nGPU0\tNV2\t X \n",
			want:  []string{"X NV2", "NV2 X"},
			numa:  []int{-1, -1},
			cpu:   []string{"", ""},
		},
		{
			name:  "single GPU",
			input: "\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-63\t0\n",
			want:  []string{"X"},
			numa:  []int{0},
			cpu:   []string{"0-63"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo, err := Parse(strings.NewReader(tt.input))
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if got := matrixOf(topo); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("matrix = %q, want %q", got, tt.want)
			}
			for p, g := range topo.GPUs {
				wantIndex := p
				if tt.index != nil {
					wantIndex = tt.index[p]
				}
				if g.Index != wantIndex {
					t.Errorf("position %d: index %d, want %d", p, g.Index, wantIndex)
				}
				if g.NUMANode != tt.numa[p] {
					t.Errorf("GPU%d: NUMANode %d, want %d", g.Index, g.NUMANode, tt.numa[p])
				}
				if g.CPUAffinity != tt.cpu[p] {
					t.Errorf("GPU%d: CPUAffinity %q, want %q", g.Index, g.CPUAffinity, tt.cpu[p])
				}
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	const hdr = "\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity\n"
	rows := []string{
		"GPU0\t X \tNV1\tNV1\tNV1\t0-7\n",
		"GPU1\tNV1\t X \tNV1\tNV1\t0-7\n",
		"GPU2\tNV1\tNV1\t X \tNV1\t0-7\n",
		"GPU3\tNV1\tNV1\tNV1\t X \t0-7\n",
	}
	with := func(i int, row string) string {
		r := append([]string(nil), rows...)
		r[i] = row
		return hdr + strings.Join(r, "")
	}
	tests := []struct {
		name  string
		input string
		want  string
	}{
		{"empty input", "", "no topology matrix found"},
		{"only blank lines and legend", "\n\n   \nLegend:\n  X = Self\n", "no topology matrix found"},
		{"no GPU columns", "\tmlx5_0\tCPU Affinity\nmlx5_0\t X \t\n", `line 1: header has no GPU<n> column`},
		{"unknown link class", with(3, "GPU3\tNVX\tNV1\tNV1\t X \t0-7\n"), `line 5, column GPU0: unknown link class "NVX"`},
		{"NVLink lanes out of range", with(1, "GPU1\tNV19\t X \tNV1\tNV1\t0-7\n"), `line 3, column GPU0: unknown link class "NV19"`},
		{"asymmetric matrix", with(3, "GPU3\tNV2\tNV1\tNV1\t X \t0-7\n"), "line 5, column GPU0: asymmetric matrix: GPU0->GPU3 is NV1 but GPU3->GPU0 is NV2 (line 2)"},
		{"missing row", hdr + rows[0] + rows[1] + rows[3], "line 1, column GPU2: GPU has a column but no row"},
		{"duplicate row", hdr + rows[0] + rows[1] + rows[1] + rows[2] + rows[3], "line 4: duplicate row GPU1 (first on line 3)"},
		{"duplicate GPU column", "\tGPU0\tGPU0\nGPU0\t X \tNV1\n", "line 1: duplicate column GPU0"},
		{"too few cells", with(2, "GPU2\tNV1\tNV1\t X \tNV1\n"), "line 4, column GPU2: row has 4 cells, want 5"},
		{"too many cells", with(0, "GPU0\t X \tNV1\tNV1\tNV1\t0-7\textra\n"), "line 2, column GPU0: row has 6 cells, want 5"},
		{"diagonal not X", with(1, "GPU1\tNV1\tNV1\tNV1\tNV1\t0-7\n"), `line 3, column GPU1: want "X" on the diagonal, got "NV1"`},
		{"X off the diagonal", with(1, "GPU1\tX\t X \tNV1\tNV1\t0-7\n"), `line 3, column GPU0: "X" off the diagonal`},
		{"bad CPU affinity", with(0, "GPU0\t X \tNV1\tNV1\tNV1\t7-3\n"), `line 2, column CPU Affinity: invalid ID list "7-3": range "7-3" runs backwards`},
		{"bad CPU affinity word", with(0, "GPU0\t X \tNV1\tNV1\tNV1\tall\n"), `line 2, column CPU Affinity: invalid ID list "all"`},
		{"bad NUMA affinity", "\tGPU0\tNUMA Affinity\nGPU0\t X \t-1\n", `line 2, column NUMA Affinity: invalid ID list "-1"`},
		{"row matches no column", hdr + rows[0] + "mlx5_0\tPIX\tPIX\tPIX\tPIX\t X \n", `line 3: row "mlx5_0" matches no column of the header (line 1)`},
		{"bad NIC cell in GPU row", "\tGPU0\tNIC0\nGPU0\t X \tFAST\n", `line 2, column NIC0: unknown link class "FAST"`},
		{"malformed GPU column", "\tGPU0\tGPUx\n", `line 1: column "GPUx": want GPU<index>`},
		{"GPU column with sign", "\tGPU0\tGPU+1\n", `line 1: column "GPU+1": want GPU<index>`},
		{"header is a data row", "GPU0\t X \tNV1\n", `line 1: column "X" is not a device or a known attribute`},
		{"orphan attribute word", "\tGPU0\tCPU\nGPU0\t X \t0\n", `line 1: column "CPU" is not a device or a known attribute`},
		{"too many GPUs", "\t" + manyGPUHeader(65) + "\n", "line 1: header has 65 GPU columns, at most 64 are supported"},
		{"line too long", "\tGPU0\n" + strings.Repeat("x", maxLineBytes+1) + "\n", "line 2: read topology"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			topo, err := Parse(strings.NewReader(tt.input))
			if err == nil {
				t.Fatalf("Parse succeeded with %d GPUs, want error containing %q", topo.Len(), tt.want)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not contain %q", err, tt.want)
			}
		})
	}
}

func manyGPUHeader(n int) string {
	cols := make([]string, n)
	for i := range cols {
		cols[i] = "GPU" + strconv.Itoa(i)
	}
	return strings.Join(cols, "\t")
}

func TestParseFileErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "absent.txt")
	if _, err := ParseFile(missing); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("ParseFile(%q) error = %v, want a wrapped not-exist error", missing, err)
	}
	bad := filepath.Join(t.TempDir(), "bad.txt")
	if err := os.WriteFile(bad, []byte("\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tNV3\t X \n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := ParseFile(bad)
	if err == nil || !strings.HasPrefix(err.Error(), bad+": line 3, column GPU0: asymmetric matrix") {
		t.Errorf("ParseFile(bad) error = %v, want it to start with the path and line", err)
	}
}
