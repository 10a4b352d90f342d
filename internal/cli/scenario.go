package cli

import (
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"

	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
)

// defaultGPUMemory is what a scenario node's GPUs hold when gpuMemory is
// not given: the size of today's most common data-centre GPUs (A100 and
// H100 80GB), so shares can be simulated without extra typing.
const defaultGPUMemory = "80Gi"

// Scenario is the what-if input of `gpulink simulate`.
type Scenario struct {
	Nodes  []ScenarioNode  `json:"nodes"`
	Policy allocate.Policy `json:"policy,omitempty"`
	// SizeMix is how often each request size is asked for, as the
	// controller's recent mix; the allocator keeps free what is asked for
	// most. Unset means the allocator's default (sizes 1-8 equally).
	SizeMix []MixEntry `json:"sizeMix,omitempty"`
	// RecentMix replays the controller's recent size mix instead: the
	// sizes of the scenario's own whole-GPU alloc steps, counted as the
	// controller counts its requests (--size-mix-window/-refresh).
	RecentMix *RecentMix `json:"recentMix,omitempty"`
	Steps     []Step     `json:"steps"`
}

// RecentMix is the controller's recent size mix (allocate.SizeHistory).
type RecentMix struct {
	// Window is how many recent requests count (default 512).
	Window *int `json:"window,omitempty"`
	// Refresh is how many requests pass between two snapshots (default
	// 64, at most the window).
	Refresh *int `json:"refresh,omitempty"`
}

// MixEntry is the share of one request size in the size mix.
type MixEntry struct {
	// GPUs is the request size in whole GPUs.
	GPUs *int `json:"gpus"`
	// Weight is how often it is asked for, relative to the other entries
	// (a count or a fraction).
	Weight *float64 `json:"weight"`
}

// ScenarioNode is one simulated node.
type ScenarioNode struct {
	Name string `json:"name"`
	// Topology is a file holding `nvidia-smi topo -m` output; relative
	// paths are relative to the scenario file.
	Topology string `json:"topology"`
	// GPUMemory is the memory of each GPU (default 80Gi).
	GPUMemory *resource.Quantity `json:"gpuMemory,omitempty"`
	// Allocated lists GPU indices already given out whole.
	Allocated []int `json:"allocated,omitempty"`
	// MaxSharesPerGPU caps shares per GPU (default: the allocator's).
	MaxSharesPerGPU *int `json:"maxSharesPerGPU,omitempty"`
}

// Step is one event: exactly one of Alloc and Free is set.
type Step struct {
	// Alloc names a new allocation.
	Alloc string `json:"alloc,omitempty"`
	// Free releases the live allocation with this name.
	Free string `json:"free,omitempty"`
	// GPUs asks for that many whole GPUs.
	GPUs *int `json:"gpus,omitempty"`
	// Require is the slowest link class acceptable between any two of
	// the GPUs, as in GpuConfig's topology.minLink; unset is best effort.
	Require string `json:"require,omitempty"`
	// Memory and Cores ask for a share of one GPU; the one left out takes
	// GpuConfig's default (4Gi, 25%).
	Memory *resource.Quantity `json:"memory,omitempty"`
	Cores  *int64             `json:"cores,omitempty"`
	// ShareGPUs puts the share on that many distinct GPUs (HAMi's
	// nvidia.com/gpu: N with gpumem: one claim, one job), chosen as one
	// set as the controller does: the strongest weakest link, then packed.
	ShareGPUs *int `json:"shareGPUs,omitempty"`
	// Node pins the allocation to one node instead of letting the
	// allocator choose among all of them.
	Node string `json:"node,omitempty"`
}

// loadedScenario is a validated scenario ready to run.
type loadedScenario struct {
	nodes  []*allocate.NodeState
	files  []string // topology file per node, as the scenario names it
	policy allocate.Policy
	// history, when set, supplies policy.Mix step by step (recentMix).
	history *allocate.SizeHistory
	steps   []plannedStep
}

// plannedStep is a validated step.
type plannedStep struct {
	op   string // "alloc" or "free"
	id   string
	node int // index into nodes; -1 lets the allocator choose
	req  allocate.Request
	// shareGPUs > 1 places req's share on that many distinct GPUs.
	shareGPUs int
}

const (
	opAlloc = "alloc"
	opFree  = "free"
)

// loadScenario reads, decodes and validates a scenario file, parsing the
// topology files it names. Every problem found is reported, each naming
// its field path.
func loadScenario(path string) (*loadedScenario, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read scenario: %w", err)
	}
	var sc Scenario
	if err := decodeStrict(raw, &sc); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", path, err)
	}
	ls, err := sc.compile(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("scenario %s: %w", path, err)
	}
	return ls, nil
}

// compile validates the scenario and builds the allocator's input; baseDir
// anchors relative topology paths.
func (sc *Scenario) compile(baseDir string) (*loadedScenario, error) {
	var errs []error
	if err := sc.Policy.Validate(); err != nil {
		errs = append(errs, err)
	}
	ls := &loadedScenario{policy: sc.Policy}
	mix, merrs := compileMix(sc.SizeMix)
	errs = append(errs, merrs...)
	ls.policy.Mix = mix
	if sc.RecentMix != nil {
		if sc.SizeMix != nil {
			errs = append(errs, errors.New("recentMix: set at most one of sizeMix and recentMix"))
		}
		window, refresh := allocate.DefaultHistoryWindow, 0
		if sc.RecentMix.Window != nil {
			window = *sc.RecentMix.Window
		}
		if sc.RecentMix.Refresh != nil {
			refresh = *sc.RecentMix.Refresh
		} else {
			refresh = min(allocate.DefaultHistoryRefresh, max(window, 1))
		}
		h, err := allocate.NewSizeHistory(window, refresh)
		if err != nil {
			errs = append(errs, fmt.Errorf("recentMix: %w", err))
		}
		ls.history = h
	}
	nodeIndex := map[string]int{}
	if len(sc.Nodes) == 0 {
		errs = append(errs, errors.New("nodes: at least one node is required"))
	}
	for i, n := range sc.Nodes {
		state, nerrs := n.compile("nodes["+strconv.Itoa(i)+"]", baseDir)
		errs = append(errs, nerrs...)
		if n.Name != "" {
			if j, dup := nodeIndex[n.Name]; dup {
				errs = append(errs, fmt.Errorf("nodes[%d].name: duplicate name %q (also nodes[%d])", i, n.Name, j))
			} else {
				nodeIndex[n.Name] = i
			}
		}
		ls.nodes = append(ls.nodes, state)
		ls.files = append(ls.files, n.Topology)
	}
	if len(sc.Steps) == 0 {
		errs = append(errs, errors.New("steps: at least one step is required"))
	}
	live := map[string]int{}  // id -> step that allocated it
	freed := map[string]int{} // id -> step that freed it
	for i, st := range sc.Steps {
		// A step with a bad size still allocates or frees its id, so that
		// its mistake does not also surface as a bogus error at a later free.
		ps, serr := st.compile(i, nodeIndex)
		errs = append(errs, serr)
		switch ps.op {
		case opAlloc:
			if at, dup := live[ps.id]; dup {
				errs = append(errs, fmt.Errorf("steps[%d].alloc: duplicate id %q: allocated at step %d and not freed", i, ps.id, at))
			}
			live[ps.id] = i
			delete(freed, ps.id)
		case opFree:
			if _, ok := live[ps.id]; !ok {
				if at, was := freed[ps.id]; was {
					errs = append(errs, fmt.Errorf("steps[%d].free: id %q was already freed at step %d", i, ps.id, at))
				} else {
					errs = append(errs, fmt.Errorf("steps[%d].free: unknown id %q: no earlier step allocates it", i, ps.id))
				}
			}
			delete(live, ps.id)
			freed[ps.id] = i
		}
		ls.steps = append(ls.steps, ps)
	}
	if err := joinProblems(errs); err != nil {
		return nil, err
	}
	return ls, nil
}

// compileMix validates the size mix and builds the allocator's; nil when
// the scenario has none.
func compileMix(entries []MixEntry) (*allocate.SizeMix, []error) {
	if entries == nil {
		return nil, nil
	}
	var errs []error
	if len(entries) == 0 {
		return nil, []error{errors.New("sizeMix: must list at least one size when set")}
	}
	freq := map[int]float64{}
	seen := map[int]int{}
	var total float64
	for i, e := range entries {
		at := "sizeMix[" + strconv.Itoa(i) + "]"
		switch {
		case e.GPUs == nil:
			errs = append(errs, fmt.Errorf("%s.gpus: required", at))
		case *e.GPUs < 1 || *e.GPUs > topology.MaxGPUs:
			errs = append(errs, fmt.Errorf("%s.gpus: must be 1..%d, got %d", at, topology.MaxGPUs, *e.GPUs))
		default:
			if j, dup := seen[*e.GPUs]; dup {
				errs = append(errs, fmt.Errorf("%s.gpus: duplicate size %d (also sizeMix[%d])", at, *e.GPUs, j))
			}
			seen[*e.GPUs] = i
		}
		switch {
		case e.Weight == nil:
			errs = append(errs, fmt.Errorf("%s.weight: required", at))
		case *e.Weight < 0 || math.IsInf(*e.Weight, 0):
			errs = append(errs, fmt.Errorf("%s.weight: must be a finite number >= 0, got %v", at, *e.Weight))
		default:
			total += *e.Weight
			if e.GPUs != nil {
				freq[*e.GPUs] = *e.Weight
			}
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	if total <= 0 || math.IsInf(total, 0) {
		return nil, []error{fmt.Errorf("sizeMix: weights must add up to a positive finite number, got %v", total)}
	}
	mix, err := allocate.NewSizeMix(freq)
	if err != nil {
		return nil, []error{fmt.Errorf("sizeMix: %w", err)}
	}
	return mix, nil
}

// compile validates one node and builds its allocator state.
func (n ScenarioNode) compile(path, baseDir string) (*allocate.NodeState, []error) {
	var errs []error
	if n.Name == "" {
		errs = append(errs, fmt.Errorf("%s.name: required", path))
	}
	label := path
	if n.Name != "" {
		label = fmt.Sprintf("%s (%s)", path, n.Name)
	}
	memory := resource.MustParse(defaultGPUMemory)
	if n.GPUMemory != nil {
		memory = *n.GPUMemory
	}
	memBytes, ok := memory.AsInt64()
	if !ok || memBytes <= 0 {
		errs = append(errs, fmt.Errorf("%s.gpuMemory: must be a positive whole number of bytes, got %s", path, memory.String()))
	}
	if n.MaxSharesPerGPU != nil && *n.MaxSharesPerGPU < 1 {
		errs = append(errs, fmt.Errorf("%s.maxSharesPerGPU: must be >= 1, got %d", path, *n.MaxSharesPerGPU))
	}
	if n.Topology == "" {
		errs = append(errs, fmt.Errorf("%s.topology: required", path))
		return nil, errs
	}
	file := n.Topology
	if !filepath.IsAbs(file) {
		file = filepath.Join(baseDir, file)
	}
	topo, err := topology.ParseFile(file)
	if err != nil {
		errs = append(errs, fmt.Errorf("%s.topology %q: %w", label, n.Topology, err))
		return nil, errs
	}
	for p := range topo.GPUs {
		topo.GPUs[p].MemoryBytes = memBytes
	}
	state := &allocate.NodeState{Name: n.Name, Topology: topo}
	if n.MaxSharesPerGPU != nil {
		state.MaxSharesPerGPU = *n.MaxSharesPerGPU
	}
	if len(n.Allocated) > 0 {
		state.Usage = make([]allocate.GPUUsage, topo.Len())
	}
	for i, idx := range n.Allocated {
		p, ok := topo.Position(idx)
		if !ok {
			errs = append(errs, fmt.Errorf("%s.allocated[%d]: GPU index %d is not in topology %s (indices %s)",
				path, i, idx, n.Topology, indexRange(topo)))
			continue
		}
		if state.Usage[p].Exclusive {
			errs = append(errs, fmt.Errorf("%s.allocated[%d]: GPU index %d is listed twice", path, i, idx))
			continue
		}
		state.Usage[p].Exclusive = true
	}
	return state, errs
}

// compile validates one step against the node names.
func (st Step) compile(i int, nodeIndex map[string]int) (plannedStep, error) {
	at := "steps[" + strconv.Itoa(i) + "]"
	var errs []error
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(at+format, args...))
	}
	ps := plannedStep{node: -1}
	switch {
	case st.Alloc != "" && st.Free != "":
		fail(": alloc and free are mutually exclusive, got alloc %q and free %q", st.Alloc, st.Free)
	case st.Alloc == "" && st.Free == "":
		fail(": one of alloc or free is required")
	case st.Free != "":
		ps.op, ps.id = opFree, st.Free
		for _, f := range []struct {
			name string
			set  bool
		}{
			{"gpus", st.GPUs != nil}, {"require", st.Require != ""}, {"memory", st.Memory != nil},
			{"cores", st.Cores != nil}, {"shareGPUs", st.ShareGPUs != nil}, {"node", st.Node != ""},
		} {
			if f.set {
				fail(".%s: not allowed with free", f.name)
			}
		}
	default:
		ps.op, ps.id = opAlloc, st.Alloc
		ps.req, errs = st.request(at, errs)
		if st.ShareGPUs != nil {
			switch {
			case ps.req.Share == nil:
				fail(".shareGPUs: applies to a share (memory/cores), not to whole GPUs")
			case *st.ShareGPUs < 1 || *st.ShareGPUs > topology.MaxGPUs:
				fail(".shareGPUs: must be between 1 and %d, got %d", topology.MaxGPUs, *st.ShareGPUs)
			default:
				ps.shareGPUs = *st.ShareGPUs
			}
		}
		if st.Node != "" {
			if j, ok := nodeIndex[st.Node]; ok {
				ps.node = j
			} else {
				fail(".node: unknown node %q", st.Node)
			}
		}
	}
	return ps, joinProblems(errs)
}

// request builds the allocator request of an alloc step.
func (st Step) request(at string, errs []error) (allocate.Request, []error) {
	fail := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf(at+format, args...))
	}
	share := st.Memory != nil || st.Cores != nil
	var req allocate.Request
	switch {
	case st.GPUs != nil && share:
		fail(": gpus and memory/cores are mutually exclusive: ask for whole GPUs or a share")
	case st.GPUs == nil && !share:
		fail(": one of gpus (whole GPUs) or memory/cores (a share) is required")
	case st.GPUs != nil:
		req.GPUs = *st.GPUs
		if req.GPUs < 1 {
			fail(".gpus: must be >= 1, got %d", req.GPUs)
		} else if req.GPUs > topology.MaxGPUs {
			fail(".gpus: must be <= %d, got %d", topology.MaxGPUs, req.GPUs)
		}
		if st.Require != "" {
			l, err := topology.ParseLinkClass(st.Require)
			if err != nil {
				fail(".require: %w", err)
			}
			req.RequiredLink = l
		}
	default:
		if st.Require != "" {
			fail(".require: applies to whole GPUs only, not to a share")
		}
		s := &allocate.ShareRequest{Cores: v1alpha1.DefaultShareCores}
		memory := resource.MustParse(v1alpha1.DefaultShareMemory)
		if st.Memory != nil {
			memory = *st.Memory
		}
		if b, ok := memory.AsInt64(); !ok || b <= 0 {
			fail(".memory: must be a positive whole number of bytes, got %s", memory.String())
		} else {
			s.MemoryBytes = b
		}
		if st.Cores != nil {
			s.Cores = *st.Cores
			if s.Cores < 1 || s.Cores > 100 {
				fail(".cores: must be between 1 and 100, got %d", s.Cores)
			}
		}
		req.Share = s
	}
	return req, errs
}

// indexRange describes a topology's GPU indices for error messages.
func indexRange(t *topology.Topology) string {
	if t.Len() == 0 {
		return "none"
	}
	idx := make([]int, t.Len())
	for p, g := range t.GPUs {
		idx[p] = g.Index
	}
	return formatIndices(idx)
}
