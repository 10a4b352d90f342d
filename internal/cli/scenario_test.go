package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// scenarioDir returns a fresh directory holding both fixtures, so scenarios
// written there can name them relatively.
func scenarioDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	copyFile(t, v100File, dir, "v100.txt")
	copyFile(t, p40File, dir, "p40.txt")
	return dir
}

const twoNodes = `nodes:
- {name: a, topology: v100.txt}
- {name: b, topology: p40.txt, gpuMemory: 24Gi}
`

func TestLoadScenarioErrors(t *testing.T) {
	tests := []struct {
		name     string
		scenario string
		want     []string
	}{
		{"zero gpus", twoNodes + "steps:\n- {alloc: j1, gpus: 1}\n- {alloc: j2, gpus: 2}\n- {alloc: j3, gpus: 0}\n", []string{"steps[2].gpus: must be >= 1, got 0"}},
		{"too many gpus", twoNodes + "steps:\n- {alloc: j1, gpus: 65}\n", []string{"steps[0].gpus: must be <= 64, got 65"}},
		{"unknown step field", twoNodes + "steps:\n- {alloc: j1, gpu: 2}\n", []string{"steps[0].gpu: unknown field"}},
		{"unknown node field", "nodes:\n- {name: a, topology: v100.txt, memory: 32Gi}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"nodes[0].memory: unknown field"}},
		{"unknown top-level field", twoNodes + "step:\n- {alloc: j, gpus: 1}\n", []string{"step: unknown field"}},
		{"wrong type", twoNodes + "steps:\n- {alloc: j1, gpus: two}\n", []string{`steps[0].gpus: must be an integer, got "two"`}},
		{"gpus and memory", twoNodes + "steps:\n- {alloc: j1, gpus: 2, memory: 10Gi}\n", []string{"steps[0]: gpus and memory/cores are mutually exclusive"}},
		{"gpus and cores", twoNodes + "steps:\n- {alloc: j1, gpus: 2, cores: 10}\n", []string{"steps[0]: gpus and memory/cores are mutually exclusive"}},
		{"alloc without size", twoNodes + "steps:\n- {alloc: j1}\n", []string{"steps[0]: one of gpus (whole GPUs) or memory/cores (a share) is required"}},
		{"neither alloc nor free", twoNodes + "steps:\n- {gpus: 1}\n", []string{"steps[0]: one of alloc or free is required"}},
		{"alloc and free", twoNodes + "steps:\n- {alloc: j1, gpus: 1}\n- {alloc: j2, free: j1}\n", []string{`steps[1]: alloc and free are mutually exclusive, got alloc "j2" and free "j1"`}},
		{"free with a size", twoNodes + "steps:\n- {alloc: j1, gpus: 1}\n- {free: j1, gpus: 1, node: a}\n", []string{"steps[1].gpus: not allowed with free", "steps[1].node: not allowed with free"}},
		{"free of unknown id", twoNodes + "steps:\n- {alloc: j1, gpus: 1}\n- {free: j2}\n", []string{`steps[1].free: unknown id "j2"`}},
		{"free twice", twoNodes + "steps:\n- {alloc: j1, gpus: 1}\n- {free: j1}\n- {free: j1}\n", []string{`steps[2].free: id "j1" was already freed at step 1`}},
		{"duplicate alloc id", twoNodes + "steps:\n- {alloc: j1, gpus: 1}\n- {alloc: j1, gpus: 2}\n", []string{`steps[1].alloc: duplicate id "j1": allocated at step 0 and not freed`}},
		{"bad link class", twoNodes + "steps:\n- {alloc: j1, gpus: 2, require: FAST}\n", []string{`steps[0].require: unknown link class "FAST"`}},
		{"link class on a share", twoNodes + "steps:\n- {alloc: j1, memory: 1Gi, require: NVLink}\n", []string{"steps[0].require: applies to whole GPUs only"}},
		{"cores out of range", twoNodes + "steps:\n- {alloc: j1, memory: 1Gi, cores: 130}\n", []string{"steps[0].cores: must be between 1 and 100, got 130"}},
		{"zero memory", twoNodes + "steps:\n- {alloc: j1, memory: 0}\n", []string{"steps[0].memory: must be a positive whole number of bytes, got 0"}},
		{"bad memory", twoNodes + "steps:\n- {alloc: j1, memory: lots}\n", []string{`steps[0].memory: invalid value "lots"`}},
		{"unknown pinned node", twoNodes + "steps:\n- {alloc: j1, gpus: 1, node: c}\n", []string{`steps[0].node: unknown node "c"`}},
		{"duplicate node name", "nodes:\n- {name: a, topology: v100.txt}\n- {name: a, topology: p40.txt}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{`nodes[1].name: duplicate name "a" (also nodes[0])`}},
		{"node without name", "nodes:\n- {topology: v100.txt}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"nodes[0].name: required"}},
		{"node without topology", "nodes:\n- {name: a}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"nodes[0].topology: required"}},
		{"missing topology file", "nodes:\n- {name: a, topology: v100.txt}\n- {name: b, topology: gone/dgx.txt}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{`nodes[1] (b).topology "gone/dgx.txt": read topology file: open `}},
		{"allocated index not in topology", "nodes:\n- {name: b, topology: p40.txt, allocated: [1, 7]}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"nodes[0].allocated[1]: GPU index 7 is not in topology p40.txt (indices 0-6)"}},
		{"allocated twice", "nodes:\n- {name: b, topology: p40.txt, allocated: [1, 1]}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"nodes[0].allocated[1]: GPU index 1 is listed twice"}},
		{"zero gpu memory", "nodes:\n- {name: a, topology: v100.txt, gpuMemory: 0}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"nodes[0].gpuMemory: must be a positive whole number of bytes, got 0"}},
		{"zero share cap", "nodes:\n- {name: a, topology: v100.txt, maxSharesPerGPU: 0}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"nodes[0].maxSharesPerGPU: must be >= 1, got 0"}},
		{"bad policy", twoNodes + "policy: {node: pack}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{`policy.node: unknown strategy "pack"`}},
		{"no nodes", "steps:\n- {alloc: j, gpus: 1}\n", []string{"nodes: at least one node is required"}},
		{"size mix without weight", twoNodes + "sizeMix:\n- {gpus: 2}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"sizeMix[0].weight: required"}},
		{"size mix size out of range", twoNodes + "sizeMix:\n- {gpus: 0, weight: 1}\n- {gpus: 65, weight: 1}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"sizeMix[0].gpus: must be 1..64, got 0", "sizeMix[1].gpus: must be 1..64, got 65"}},
		{"size mix duplicate size", twoNodes + "sizeMix:\n- {gpus: 2, weight: 1}\n- {gpus: 2, weight: 3}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"sizeMix[1].gpus: duplicate size 2 (also sizeMix[0])"}},
		{"size mix negative weight", twoNodes + "sizeMix:\n- {gpus: 2, weight: -1}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"sizeMix[0].weight: must be a finite number >= 0, got -1"}},
		{"size mix all zero", twoNodes + "sizeMix:\n- {gpus: 2, weight: 0}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"sizeMix: weights must add up to a positive finite number, got 0"}},
		{"size mix empty", twoNodes + "sizeMix: []\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"sizeMix: must list at least one size when set"}},
		{"size mix unknown field", twoNodes + "sizeMix:\n- {gpus: 2, weight: 1, share: 3}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{"sizeMix[0].share: unknown field"}},
		{"size mix wrong type", twoNodes + "sizeMix:\n- {gpus: 2, weight: often}\nsteps:\n- {alloc: j, gpus: 1}\n", []string{`sizeMix[0].weight: must be a number, got "often"`}},
		{"no steps", twoNodes, []string{"steps: at least one step is required"}},
		{"a bad alloc does not make its free an error too", twoNodes + "steps:\n- {alloc: j1, gpus: 0}\n- {free: j1}\n", []string{"steps[0].gpus: must be >= 1, got 0"}},
		{"several problems at once", twoNodes + "steps:\n- {alloc: j1, gpus: 0}\n- {free: j9}\n", []string{"steps[0].gpus: must be >= 1, got 0", `steps[1].free: unknown id "j9"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := scenarioDir(t)
			path := writeFile(t, dir, "scenario.yaml", tt.scenario)
			_, err := loadScenario(path)
			if err == nil {
				t.Fatal("loadScenario succeeded, want an error")
			}
			if !strings.Contains(err.Error(), path) {
				t.Errorf("error %q does not name the scenario file", err)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			// Each expected problem (one per wanted substring) is reported
			// once, and nothing else.
			if n := strings.Count(err.Error(), "\n  - "); len(tt.want) > 1 && n != len(tt.want) || len(tt.want) == 1 && n != 0 {
				t.Errorf("error %q lists %d problems, want %d", err, n, len(tt.want))
			}
		})
	}
}

func TestLoadScenarioValid(t *testing.T) {
	dir := scenarioDir(t)
	path := writeFile(t, dir, "scenario.yaml", `nodes:
- {name: a, topology: v100.txt, gpuMemory: 32Gi, allocated: [1, 6], maxSharesPerGPU: 4}
- {name: b, topology: p40.txt}
policy: {node: spread, gpu: binpack}
steps:
- {alloc: j1, gpus: 2, require: NV2}
- {alloc: j2, memory: 10Gi}
- {alloc: j3, cores: 40, node: b}
- {free: j1}
- {alloc: j1, gpus: 1}
`)
	ls, err := loadScenario(path)
	if err != nil {
		t.Fatalf("loadScenario: %v", err)
	}
	a := ls.nodes[0]
	if a.Name != "a" || a.Topology.Len() != 8 || a.MaxSharesPerGPU != 4 || a.Topology.GPUs[0].MemoryBytes != 32<<30 {
		t.Errorf("node a = %+v", a)
	}
	for p, u := range a.Usage {
		if want := p == 1 || p == 6; u.Exclusive != want {
			t.Errorf("node a GPU%d exclusive = %t, want %t", p, u.Exclusive, want)
		}
	}
	if b := ls.nodes[1]; b.Topology.GPUs[0].MemoryBytes != 80<<30 || b.Usage != nil {
		t.Errorf("node b memory = %d, usage %v; want the 80Gi default and no usage", b.Topology.GPUs[0].MemoryBytes, b.Usage)
	}
	if ls.policy.Node != "spread" {
		t.Errorf("policy = %+v", ls.policy)
	}
	steps := ls.steps
	if len(steps) != 5 {
		t.Fatalf("%d steps, want 5", len(steps))
	}
	if s := steps[0]; s.op != opAlloc || s.req.GPUs != 2 || s.req.RequiredLink != topology.NVLink(2) || s.node != -1 {
		t.Errorf("steps[0] = %+v", s)
	}
	// A share that leaves out cores or memory gets GpuConfig's defaults.
	if s := steps[1].req.Share; s == nil || s.MemoryBytes != 10<<30 || s.Cores != 25 {
		t.Errorf("steps[1] share = %+v, want 10Gi and the default 25 cores", s)
	}
	if s := steps[2]; s.node != 1 || s.req.Share == nil || s.req.Share.MemoryBytes != 4<<30 || s.req.Share.Cores != 40 {
		t.Errorf("steps[2] = %+v (share %+v), want node b, the default 4Gi and 40 cores", s, s.req.Share)
	}
	if s := steps[3]; s.op != opFree || s.id != "j1" {
		t.Errorf("steps[3] = %+v", s)
	}
}

func TestScenarioTopologyPaths(t *testing.T) {
	root := t.TempDir()
	abs := copyFile(t, p40File, root, "shared/p40.txt")
	copyFile(t, v100File, root, "plans/topos/v100.txt")
	tests := []struct {
		name     string
		scenario string
	}{
		{"relative to the scenario file", "nodes:\n- {name: a, topology: topos/v100.txt}\n"},
		{"relative with ..", "nodes:\n- {name: a, topology: ../shared/p40.txt}\n"},
		{"absolute", "nodes:\n- {name: a, topology: " + abs + "}\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// The test's working directory is the package, not root: a
			// path resolved against it would not exist.
			path := writeFile(t, root, "plans/s.yaml", tt.scenario+"steps:\n- {alloc: j, gpus: 1}\n")
			stdout, stderr, code := runCLI(t, "simulate", "--scenario", path, "-o", "json")
			if code != 0 {
				t.Fatalf("exit code %d, stderr:\n%s", code, stderr)
			}
			if !strings.Contains(stdout, `"node":"a"`) {
				t.Errorf("output does not place the step on node a:\n%s", stdout)
			}
		})
	}
	t.Run("missing file names node and path", func(t *testing.T) {
		path := writeFile(t, root, "plans/bad.yaml", "nodes:\n- {name: a, topology: topos/missing.txt}\nsteps:\n- {alloc: j, gpus: 1}\n")
		_, stderr, code := runCLI(t, "simulate", "--scenario", path)
		want := []string{`nodes[0] (a).topology "topos/missing.txt"`, filepath.Join(root, "plans", "topos", "missing.txt")}
		if code == 0 {
			t.Fatal("exit code 0, want failure")
		}
		for _, w := range want {
			if !strings.Contains(stderr, w) {
				t.Errorf("stderr does not contain %q:\n%s", w, stderr)
			}
		}
	})
}
