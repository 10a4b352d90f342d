package cli

import (
	"bufio"
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// stepJSON mirrors one documented --output json line.
type stepJSON struct {
	Step   int    `json:"step"`
	Op     string `json:"op"`
	ID     string `json:"id"`
	Node   string `json:"node"`
	GPUs   []int  `json:"gpus"`
	Link   string `json:"link"`
	Memory string `json:"memory"`
	Cores  int64  `json:"cores"`
	Error  string `json:"error"`
}

func runSimulateJSON(t *testing.T, scenario string) ([]stepJSON, []string) {
	t.Helper()
	stdout, stderr, code := runCLI(t, "simulate", "--scenario", scenario, "--output", "json")
	if code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, stderr)
	}
	var steps []stepJSON
	var lines []string
	sc := bufio.NewScanner(strings.NewReader(stdout))
	for sc.Scan() {
		var s stepJSON
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			t.Fatalf("line %q is not a documented step object: %v", sc.Text(), err)
		}
		if s.Step != len(steps) {
			t.Fatalf("line %q has step %d, want %d", sc.Text(), s.Step, len(steps))
		}
		steps = append(steps, s)
		lines = append(lines, sc.Text())
	}
	return steps, lines
}

func mustParse(t *testing.T, path string) *topology.Topology {
	t.Helper()
	topo, err := topology.ParseFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return topo
}

func TestSimulateExampleScenario(t *testing.T) {
	topos := map[string]*topology.Topology{"node-v100": mustParse(t, v100File), "node-p40": mustParse(t, p40File)}
	steps, lines := runSimulateJSON(t, filepath.Join(demoDir, "example.yaml"))
	if len(steps) != 13 {
		t.Fatalf("%d steps, want 13", len(steps))
	}

	// Replay the output against the topologies: every reported link must
	// be the weakest link of the reported GPUs, whole GPUs must never be
	// given out twice, and a required NVLink set must be all NVLink.
	inUse := map[string]map[int]string{"node-v100": {6: "preallocated"}, "node-p40": {5: "preallocated"}}
	held := map[string]stepJSON{}
	failures := 0
	for i, s := range steps {
		switch {
		case s.Op == "free":
			a, ok := held[s.ID]
			if !ok {
				t.Fatalf("step %d frees %q, which holds nothing", i, s.ID)
			}
			if a.Memory == "" {
				for _, g := range a.GPUs {
					delete(inUse[a.Node], g)
				}
			}
			delete(held, s.ID)
		case s.Error != "":
			failures++
			if s.Node != "" || s.GPUs != nil {
				t.Errorf("failed step %d also reports a placement: %+v", i, s)
			}
		default:
			topo := topos[s.Node]
			pos := make([]int, len(s.GPUs))
			for j, idx := range s.GPUs {
				p, ok := topo.Position(idx)
				if !ok {
					t.Fatalf("step %d: GPU %d is not on %s", i, idx, s.Node)
				}
				pos[j] = p
				if s.Memory == "" {
					if other, busy := inUse[s.Node][idx]; busy {
						t.Errorf("step %d (%s) got GPU %d on %s, already held by %s", i, s.ID, idx, s.Node, other)
					}
					inUse[s.Node][idx] = s.ID
				}
			}
			want := ""
			if l := topo.WeakestLink(pos); l != topology.LinkNone {
				want = l.String()
			}
			if s.Link != want {
				t.Errorf("step %d: link %q, but the weakest link of GPUs %v is %q", i, s.Link, s.GPUs, want)
			}
			held[s.ID] = s
		}
	}
	if failures != 2 {
		t.Errorf("%d failed steps, want 2 (the NVLink quad and the pinned share)", failures)
	}

	// Spot checks of what the example is there to show.
	pair := steps[0]
	if pair.Node != "node-v100" || pair.Link != "NV2" || len(pair.GPUs) != 2 {
		t.Errorf("2-GPU best-effort job = %+v, want an NV2 pair on the V100 node", pair)
	}
	if slices.ContainsFunc(pair.GPUs, func(g int) bool { return g <= 3 }) {
		t.Errorf("2-GPU job took %v, breaking the only intact NVLink quad 0-3", pair.GPUs)
	}
	if quad := steps[1]; quad.Error != "" || !slices.Equal(quad.GPUs, []int{0, 1, 2, 3}) {
		t.Errorf("4-GPU NVLink job = %+v, want the intact quad 0-3", quad)
	}
	if s := steps[2]; !strings.Contains(s.Error, "NVLink") {
		t.Errorf("second 4-GPU NVLink job = %+v, want a failure naming NVLink", s)
	}
	if s := steps[4]; s.Link != "PIX" || len(s.GPUs) != 3 {
		t.Errorf("3-GPU PIX job = %+v, want three GPUs behind one switch", s)
	}
	if a, b := steps[5], steps[6]; a.Memory != "10Gi" || a.Cores != 30 || b.Memory != "8Gi" || b.Cores != 25 ||
		a.Node != b.Node || !slices.Equal(a.GPUs, b.GPUs) {
		t.Errorf("shares = %+v and %+v, want 10Gi/30 and 8Gi/25 stacked on one GPU", a, b)
	}
	if s := steps[8]; s.Node != "" || !strings.Contains(s.Error, "node-p40") {
		t.Errorf("pinned share = %+v, want a failure on node-p40", s)
	}
	if lines[9] != `{"step":9,"op":"free","id":"train-quad"}` {
		t.Errorf("free line = %s", lines[9])
	}
	if s := steps[10]; s.Error != "" || s.Link != "NV1" || len(s.GPUs) != 4 {
		t.Errorf("retried NVLink quad = %+v, want success after the free", s)
	}
}

func TestSimulateSmallScenarios(t *testing.T) {
	tests := []struct {
		name  string
		steps string
		check func(t *testing.T, steps []stepJSON, lines []string)
	}{
		{
			name:  "two GPUs land on an NV2 pair",
			steps: "- {alloc: j, gpus: 2}\n",
			check: func(t *testing.T, steps []stepJSON, _ []string) {
				if s := steps[0]; s.Link != "NV2" || len(s.GPUs) != 2 {
					t.Errorf("got %+v, want an NV2 pair", s)
				}
			},
		},
		{
			name:  "one GPU has no link field",
			steps: "- {alloc: j, gpus: 1}\n",
			check: func(t *testing.T, _ []stepJSON, lines []string) {
				if strings.Contains(lines[0], `"link"`) || !strings.Contains(lines[0], `"gpus":[`) {
					t.Errorf("line %s: want gpus and no link", lines[0])
				}
			},
		},
		{
			name:  "a share reports memory and cores",
			steps: "- {alloc: s, memory: 1536Mi, cores: 10}\n",
			check: func(t *testing.T, steps []stepJSON, _ []string) {
				if s := steps[0]; s.Memory != "1536Mi" || s.Cores != 10 || len(s.GPUs) != 1 || s.Link != "" {
					t.Errorf("got %+v, want one GPU with 1536Mi and 10 cores", s)
				}
			},
		},
		{
			name:  "the whole node, then nothing left",
			steps: "- {alloc: all, gpus: 8}\n- {alloc: one, gpus: 1}\n- {free: all}\n- {alloc: again, gpus: 1}\n",
			check: func(t *testing.T, steps []stepJSON, _ []string) {
				if s := steps[0]; s.Link != "SYS" || len(s.GPUs) != 8 {
					t.Errorf("all GPUs = %+v, want 8 with weakest link SYS", s)
				}
				if s := steps[1]; s.Error == "" {
					t.Errorf("9th GPU = %+v, want a failure", s)
				}
				if s := steps[3]; s.Error != "" {
					t.Errorf("after the free = %+v, want success", s)
				}
			},
		},
		{
			name:  "freeing a failed allocation is reported, not fatal",
			steps: "- {alloc: big, gpus: 9}\n- {free: big}\n- {alloc: big, gpus: 1}\n",
			check: func(t *testing.T, steps []stepJSON, _ []string) {
				if s := steps[1]; !strings.Contains(s.Error, "allocation at step 0 failed") {
					t.Errorf("free of failed id = %+v, want an error naming step 0", s)
				}
				if s := steps[2]; s.Error != "" {
					t.Errorf("re-alloc = %+v, want success", s)
				}
			},
		},
		{
			// HAMi's nvidia.com/gpu: 2 with gpumem: one job on two GPUs,
			// chosen as a set as the controller does: an NV2 pair (the
			// best link a pair has here) that packs onto the GPU the
			// earlier share took; freed together.
			name:  "a share on two GPUs gets an NV2 pair with the shared GPU",
			steps: "- {alloc: small, memory: 4Gi}\n- {alloc: pair, memory: 8Gi, shareGPUs: 2}\n- {free: pair}\n",
			check: func(t *testing.T, steps []stepJSON, _ []string) {
				s := steps[1]
				if s.Error != "" || s.Link != "NV2" || len(s.GPUs) != 2 || !slices.Contains(s.GPUs, steps[0].GPUs[0]) {
					t.Errorf("got %+v, want an NV2 pair with GPU %v of the earlier share", s, steps[0].GPUs)
				}
				if f := steps[2]; f.Error != "" || f.Op != "free" {
					t.Errorf("free = %+v, want both shares released", f)
				}
			},
		},
		{
			name:  "a share larger than the GPU fails",
			steps: "- {alloc: s, memory: 81Gi}\n",
			check: func(t *testing.T, steps []stepJSON, _ []string) {
				if s := steps[0]; s.Error == "" {
					t.Errorf("got %+v, want a failure: GPUs hold 80Gi by default", s)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := scenarioDir(t)
			path := writeFile(t, dir, "s.yaml", "nodes:\n- {name: a, topology: v100.txt}\nsteps:\n"+tt.steps)
			steps, lines := runSimulateJSON(t, path)
			tt.check(t, steps, lines)
		})
	}
}

// TestSimulateReplaysSizeMix checks that the scenario's size mix reaches
// the allocator: on the P40 box (switches {0,1,2} and {3,4,5,6}) with 5
// and 6 in use, one GPU is taken from the intact triple when pairs are
// what is asked for (leaving two switch pairs), and from the other switch
// when triples are (leaving the triple).
func TestSimulateReplaysSizeMix(t *testing.T) {
	for _, tt := range []struct {
		mix  string
		want int
	}{
		{"sizeMix:\n- {gpus: 1, weight: 5}\n- {gpus: 2, weight: 5}\n", 0},
		{"sizeMix:\n- {gpus: 1, weight: 5}\n- {gpus: 3, weight: 5}\n", 3},
	} {
		dir := scenarioDir(t)
		path := writeFile(t, dir, "s.yaml", "nodes:\n- {name: b, topology: p40.txt, allocated: [5, 6]}\n"+tt.mix+"steps:\n- {alloc: j, gpus: 1}\n")
		steps, _ := runSimulateJSON(t, path)
		if got := steps[0].GPUs; len(got) != 1 || got[0] != tt.want {
			t.Errorf("mix %q: got GPUs %v, want [%d]", tt.mix, got, tt.want)
		}
	}
}

// TestSimulateReplaysRecentMix: recentMix counts the scenario's own
// requests as the controller does (a request counts before it is
// decided), so the last step sees the pairs or triples before it. Those
// need NVLink, which the P40 box lacks, and fail without changing the
// GPUs in use.
func TestSimulateReplaysRecentMix(t *testing.T) {
	for _, tt := range []struct {
		size, want int
	}{{2, 0}, {3, 3}} {
		dir := scenarioDir(t)
		steps := ""
		for i := range 6 {
			steps += fmt.Sprintf("- {alloc: nv%d, gpus: %d, require: NVLink}\n", i, tt.size)
		}
		path := writeFile(t, dir, "s.yaml", "nodes:\n- {name: b, topology: p40.txt, allocated: [5, 6]}\nrecentMix: {window: 16, refresh: 1}\nsteps:\n"+steps+"- {alloc: j, gpus: 1}\n")
		out, _ := runSimulateJSON(t, path)
		if got := out[len(out)-1].GPUs; len(got) != 1 || got[0] != tt.want {
			t.Errorf("after %d-GPU requests: got GPUs %v, want [%d]", tt.size, got, tt.want)
		}
	}
	dir := scenarioDir(t)
	path := writeFile(t, dir, "s.yaml", "nodes:\n- {name: b, topology: p40.txt}\nsizeMix:\n- {gpus: 1, weight: 1}\nrecentMix: {window: 4, refresh: 5}\nsteps:\n- {alloc: j, gpus: 1}\n")
	if _, stderr, code := runCLI(t, "simulate", "--scenario", path); code == 0 ||
		!strings.Contains(stderr, "set at most one of sizeMix and recentMix") || !strings.Contains(stderr, "refresh must be 1..window (4), got 5") {
		t.Errorf("invalid recentMix: exit %d, stderr %q", code, stderr)
	}
}

func TestSimulateTable(t *testing.T) {
	stdout, stderr, code := runCLI(t, "simulate", "-f", filepath.Join(demoDir, "example.yaml"))
	if code != 0 {
		t.Fatalf("exit code %d, stderr:\n%s", code, stderr)
	}
	for _, want := range []string{
		"STEP  OP     ID",
		"FREE AFTER",
		"FAILED: no node has 4 free GPUs with every pair NVLink",
		"released",
		"10Gi, 30% cores",
		"node-v100  8 (v100-sxm2-8-aliyun-sccgn6.txt)",
		"GPU2: 1 share(s), 8Gi, 25% cores",
	} {
		if !strings.Contains(stdout, want) {
			t.Errorf("table does not contain %q:\n%s", want, stdout)
		}
	}
}

func TestSimulateInvalidScenario(t *testing.T) {
	dir := scenarioDir(t)
	path := writeFile(t, dir, "s.yaml", "nodes:\n- {name: a, topology: v100.txt}\nsteps:\n- {alloc: j, gpus: 0}\n")
	stdout, stderr, code := runCLI(t, "simulate", "--scenario", path, "-o", "json")
	if code == 0 || stdout != "" {
		t.Fatalf("exit code %d, stdout %q; want a failure and no output", code, stdout)
	}
	if !strings.Contains(stderr, "steps[0].gpus: must be >= 1, got 0") {
		t.Errorf("stderr = %q", stderr)
	}
	path = writeFile(t, dir, "g.yaml", "nodes:\n- {name: a, topology: v100.txt}\nsteps:\n- {alloc: j, gpus: 2, shareGPUs: 2}\n")
	if _, stderr, code := runCLI(t, "simulate", "--scenario", path, "-o", "json"); code == 0 || !strings.Contains(stderr, "steps[0].shareGPUs: applies to a share") {
		t.Errorf("shareGPUs with whole GPUs: exit %d, stderr %q", code, stderr)
	}
	if _, stderr, _ := runCLI(t, "simulate", "--scenario", filepath.Join(dir, "none.yaml")); !strings.Contains(stderr, "none.yaml") {
		t.Errorf("missing scenario: stderr = %q, want the path", stderr)
	}
}
