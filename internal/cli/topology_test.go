package cli

import (
	"encoding/json"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
)

// topologyJSON mirrors the documented --output json shape, decoded without
// reusing the command's own types so the test pins the wire format.
type topologyJSON struct {
	GPUs []struct {
		Index       int            `json:"index"`
		NUMANode    *int           `json:"numaNode"`
		CPUAffinity string         `json:"cpuAffinity"`
		Island      int            `json:"island"`
		Groups      map[string]int `json:"groups"`
		LinksAttr   string         `json:"linksAttr"`
	} `json:"gpus"`
	Links   [][]string         `json:"links"`
	Islands [][]int            `json:"islands"`
	Groups  map[string][][]int `json:"groups"`
}

func runTopologyJSON(t *testing.T, file string) topologyJSON {
	t.Helper()
	stdout, stderr, code := runCLI(t, "topology", file, "--output", "json")
	if code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, stderr)
	}
	var got topologyJSON
	dec := json.NewDecoder(strings.NewReader(stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&got); err != nil {
		t.Fatalf("output is not the documented JSON object: %v\n%s", err, stdout)
	}
	if dec.More() {
		t.Fatalf("output holds more than one JSON value:\n%s", stdout)
	}
	return got
}

func TestTopologyJSONV100(t *testing.T) {
	got := runTopologyJSON(t, v100File)

	if len(got.GPUs) != 8 {
		t.Fatalf("%d GPUs, want 8", len(got.GPUs))
	}
	// The hybrid cube mesh is one NVLink island.
	if want := [][]int{{0, 1, 2, 3, 4, 5, 6, 7}}; !reflect.DeepEqual(got.Islands, want) {
		t.Errorf("islands = %v, want %v", got.Islands, want)
	}
	// Every aligned pair is an NV2 bond and the two quads are the halves.
	for _, pair := range got.Groups["2"] {
		if len(pair) != 2 || got.Links[pair[0]][pair[1]] != "NV2" {
			t.Errorf("aligned pair %v is not an NV2 bond (links row %v)", pair, got.Links[pair[0]])
		}
	}
	if len(got.Groups["2"]) != 4 {
		t.Errorf("groups[2] = %v, want 4 pairs", got.Groups["2"])
	}
	if want := [][]int{{0, 1, 2, 3}, {4, 5, 6, 7}}; !reflect.DeepEqual(got.Groups["4"], want) {
		t.Errorf("groups[4] = %v, want %v", got.Groups["4"], want)
	}
	if _, ok := got.Groups["8"]; ok {
		t.Error("groups has size 8, which would group the whole node")
	}
	wantRow0 := []string{"X", "NV1", "NV1", "NV2", "SYS", "SYS", "NV2", "SYS"}
	if !reflect.DeepEqual(got.Links[0], wantRow0) {
		t.Errorf("links[0] = %v, want %v (first row of the fixture)", got.Links[0], wantRow0)
	}
	for i, row := range got.Links {
		if row[i] != "X" {
			t.Errorf("links[%d][%d] = %q, want X", i, i, row[i])
		}
		for j := range row {
			if row[j] != got.Links[j][i] {
				t.Errorf("links[%d][%d] = %q but links[%d][%d] = %q", i, j, row[j], j, i, got.Links[j][i])
			}
		}
	}
	g0 := got.GPUs[0]
	if g0.Index != 0 || g0.LinksAttr != "X112SS2S" || g0.NUMANode != nil || g0.CPUAffinity != "0-95" || g0.Island != 0 {
		t.Errorf("gpus[0] = %+v, want index 0, linksAttr X112SS2S, numaNode null, cpuAffinity 0-95, island 0", g0)
	}
	for i, g := range got.GPUs {
		if g.Index != i {
			t.Errorf("gpus[%d].index = %d, want index order", i, g.Index)
		}
		for size, groups := range got.Groups {
			id, ok := g.Groups[size]
			if !ok || id >= len(groups) || !slices.Contains(groups[id], g.Index) {
				t.Errorf("gpus[%d].groups[%s] = %d (present %t), but groups[%s] = %v", i, size, id, ok, size, groups)
			}
		}
	}
}

func TestTopologyJSONP40(t *testing.T) {
	got := runTopologyJSON(t, p40File)
	if len(got.GPUs) != 7 {
		t.Fatalf("%d GPUs, want 7 (the NIC column must not count)", len(got.GPUs))
	}
	if len(got.Islands) != 7 {
		t.Errorf("islands = %v, want 7 single-GPU islands (no NVLink)", got.Islands)
	}
	for i, g := range got.GPUs {
		if g.NUMANode == nil || *g.NUMANode != 0 || g.CPUAffinity != "0-13,28-41" || g.Island != i {
			t.Errorf("gpus[%d] = %+v, want numaNode 0, cpuAffinity 0-13,28-41, island %d", i, g, i)
		}
	}
	if got.Links[0][1] != "PIX" || got.Links[0][3] != "PHB" || got.Links[3][6] != "PIX" {
		t.Errorf("links = %v, want PIX within a switch (0-2, 3-6) and PHB across", got.Links)
	}
	// The only aligned quad is the larger switch, and no pair spans switches.
	if want := [][]int{{3, 4, 5, 6}}; !reflect.DeepEqual(got.Groups["4"], want) {
		t.Errorf("groups[4] = %v, want %v", got.Groups["4"], want)
	}
	for _, pair := range got.Groups["2"] {
		if got.Links[pair[0]][pair[1]] != "PIX" {
			t.Errorf("aligned pair %v crosses switches", pair)
		}
	}
	if got.GPUs[2].LinksAttr != "PPXHHHH" {
		t.Errorf("gpus[2].linksAttr = %q, want PPXHHHH", got.GPUs[2].LinksAttr)
	}
}

func TestTopologyTable(t *testing.T) {
	tests := []struct {
		file string
		want []string
	}{
		{v100File, []string{
			"v100-sxm2-8-aliyun-sccgn6.txt: 8 GPUs",
			"GPU0   X     NV1   NV1   NV2   SYS   SYS   NV2   SYS   -     0-95",
			"island 0  GPUs 0-7",
			"group4=0  GPUs 0-3  weakest NV1",
			"DEVICE  index  numaNode  nvlinkIsland  group2  group4  links",
			"gpu-0   0      -         0",
			"X112SS2S",
		}},
		{p40File, []string{
			"p40-pcie-7.txt: 7 GPUs",
			"GPU3   PHB   PHB   PHB   X     PIX   PIX   PIX   0     0-13,28-41",
			"none: no two GPUs share NVLink",
			"group4=0       GPUs 3-6  weakest PIX",
			"group4 (none)  GPUs 0-2  left over",
			"gpu-2   2      0         2             -       -       PPXHHHH",
		}},
	}
	for _, tt := range tests {
		t.Run(filepath.Base(tt.file), func(t *testing.T) {
			stdout, stderr, code := runCLI(t, "topology", tt.file)
			if code != 0 {
				t.Fatalf("exit code %d, stderr:\n%s", code, stderr)
			}
			for _, want := range tt.want {
				if !strings.Contains(stdout, want) {
					t.Errorf("table does not contain %q:\n%s", want, stdout)
				}
			}
		})
	}
}

func TestTopologyErrors(t *testing.T) {
	dir := t.TempDir()
	asymmetric := writeFile(t, dir, "asym.txt", "\tGPU0\tGPU1\nGPU0\t X \tNV1\nGPU1\tSYS\t X \n")
	garbage := writeFile(t, dir, "garbage.txt", "this is not nvidia-smi output\n")
	tests := []struct {
		name string
		file string
		want []string
	}{
		{"missing file", filepath.Join(dir, "nope.txt"), []string{"nope.txt", "no such file"}},
		{"asymmetric matrix", asymmetric, []string{"asym.txt", "asymmetric matrix: GPU0->GPU1 is NV1 but GPU1->GPU0 is SYS"}},
		{"not a topology", garbage, []string{"garbage.txt: line 1", "no GPU<n> column"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, format := range []string{"table", "json"} {
				stdout, stderr, code := runCLI(t, "topology", tt.file, "-o", format)
				if code == 0 {
					t.Fatalf("-o %s: exit code 0, want failure; stdout:\n%s", format, stdout)
				}
				if stdout != "" {
					t.Errorf("-o %s: failed run printed to stdout:\n%s", format, stdout)
				}
				for _, w := range append([]string{"Error: "}, tt.want...) {
					if !strings.Contains(stderr, w) {
						t.Errorf("-o %s: stderr does not contain %q:\n%s", format, w, stderr)
					}
				}
			}
		})
	}
}
