package tracebench

import (
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"regexp"
	"slices"
	"strconv"
)

// Lists with GPU-model constraints.
//
// The published lists carry no gpu_spec. FGD's evaluation (§6.5 of the
// paper; the artifact's openb_pod_list_gpuspec10/20/25/33) adds GPU-type
// requirements to a share of the GPU tasks of the default list: about a
// third of the GPU tasks of the production cluster had one. Those lists
// are not in the shared copy, so the replay makes its own at run time from
// a shared list, by the same recipe, and never writes them anywhere:
//
//   - a list named BASE-specNN (for example default-spec33) is BASE with NN
//     % of its GPU tasks constrained, chosen uniformly at random without
//     replacement; BASE-specNNu draws the models differently (below);
//   - each chosen task is pinned to one node model drawn among the models
//     of which at least one node could hold it when idle (enough GPUs, CPU
//     and memory), with probability proportional to those nodes' GPUs
//     (specNN: constrained demand in proportion to supply, as a production
//     cluster's users would pin the models it has) or uniformly among the
//     models (specNNu: the rare models as often as the common ones, a
//     harder case for placement);
//   - a task pinned to V100M16 or V100M32 is given both ("V100M16|V100M32",
//     the form of the artifact's example) with probability 1/2;
//   - the draw is seeded by the list's name, so a name is always the same
//     list, and the Monte-Carlo seeds then draw tasks from it as from any
//     list.
//
// CPU-only tasks are never constrained (they ask for no GPU).

// specName matches a generated list's name: base, percent, uniform draw.
var specName = regexp.MustCompile(`^(.+)-spec([0-9]{1,3})(u?)$`)

// parseSpecName splits a generated list's name; ok is false for any other.
func parseSpecName(list string) (base string, percent int, uniform, ok bool, err error) {
	m := specName.FindStringSubmatch(list)
	if m == nil {
		return "", 0, false, false, nil
	}
	p, err := strconv.Atoi(m[2])
	if err != nil || p < 1 || p > 100 {
		return "", 0, false, true, fmt.Errorf("list %q: the constrained share must be 1..100 %%, got %s", list, m[2])
	}
	return m[1], p, m[3] == "u", true, nil
}

// WithModelConstraints returns tasks with percent % of the GPU tasks
// pinned to node models as the package comment describes; the draw is
// seeded by name. tasks is not changed.
func WithModelConstraints(nodes []Node, tasks []Task, percent int, uniform bool, name string) ([]Task, error) {
	if percent < 1 || percent > 100 {
		return nil, fmt.Errorf("list %s: constrained share must be 1..100 %%, got %d", name, percent)
	}
	h := fnv.New64a()
	h.Write([]byte(name))
	rng := rand.New(rand.NewPCG(h.Sum64(), 0x9e3779b97f4a7c15))
	out := slices.Clone(tasks)
	var gpu []int
	for i := range out {
		if out[i].GPUs > 0 {
			gpu = append(gpu, i)
		}
	}
	want := (len(gpu)*percent + 50) / 100
	rng.Shuffle(len(gpu), func(a, b int) { gpu[a], gpu[b] = gpu[b], gpu[a] })
	// Models in the node list's order of first appearance, so the draw
	// does not depend on map order.
	var models []string
	for _, n := range nodes {
		if n.GPUs > 0 && !slices.Contains(models, n.Model) {
			models = append(models, n.Model)
		}
	}
	weights := make([]int64, len(models))
	for _, i := range gpu[:want] {
		t := &out[i]
		var total int64
		for mi, m := range models {
			weights[mi] = 0
			for _, n := range nodes {
				if n.Model == m && n.GPUs >= t.GPUs && n.CPUMilli >= t.CPUMilli && n.MemoryMiB >= t.MemoryMiB {
					if uniform {
						weights[mi] = 1
						break
					}
					weights[mi] += int64(n.GPUs)
				}
			}
			total += weights[mi]
		}
		if total == 0 {
			// No node could ever hold it: leave it unconstrained, it
			// fails the same for every policy either way.
			continue
		}
		r := rng.Int64N(total)
		pick := 0
		for r >= weights[pick] {
			r -= weights[pick]
			pick++
		}
		m := models[pick]
		t.Models = []string{m}
		if (m == "V100M16" || m == "V100M32") && rng.IntN(2) == 0 {
			t.Models = []string{"V100M16", "V100M32"}
		}
	}
	return out, nil
}
