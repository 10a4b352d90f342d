package cli

import (
	"testing"
)

// FuzzScenarioDecode checks that no scenario text makes decoding or step
// validation panic. Nodes are not compiled: that reads the files a
// scenario names, which fuzzed paths must not reach.
func FuzzScenarioDecode(f *testing.F) {
	for _, seed := range []string{
		"",
		"nodes:\n- {name: a, topology: v100.txt, gpuMemory: 32Gi, allocated: [1]}\nsteps:\n- {alloc: j, gpus: 2, require: NVLink}\n- {free: j}\n",
		"steps:\n- {alloc: s, memory: 10Gi, cores: 30, node: a}\n",
		`{"steps":[{"alloc":"x","gpus":1e30}],"policy":{"node":"spread"}}`,
		"steps:\n- {alloc: s, memory: 9999999999999999999Ei}\n",
		"steps: &a [*a]\n",
		"[]",
		"null",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		var sc Scenario
		if err := decodeStrict(raw, &sc); err != nil {
			return
		}
		nodes := map[string]int{"a": 0}
		for i, st := range sc.Steps {
			ps, err := st.compile(i, nodes)
			if err != nil {
				continue
			}
			if ps.op != opAlloc && ps.op != opFree {
				t.Fatalf("step %d compiled to op %q", i, ps.op)
			}
			if ps.op == opAlloc {
				if err := ps.req.Validate(); err != nil {
					t.Fatalf("step %d passed validation but the allocator rejects it: %v", i, err)
				}
			}
		}
	})
}
