package tracebench

import (
	"errors"
	"fmt"
	"math/rand/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// gpulinkPolicy places GPU tasks the way gpulink-controller does for a
// pod with one claim of one request (whole GPUs by count, or one share):
// nodes are filtered by the pod's CPU and memory fit (the controller's
// node fit) and by the class's product selector (gpu_spec: a node whose
// GPUs no selector admits has no eligible device), then
// allocate.ChooseNode ranks the rest and picks the GPUs, under the
// controller's default policy (binpack for nodes and GPUs) and its recent
// size mix (allocate.SizeHistory with the controller's default window and
// refresh; each whole-GPU request counts before it is decided). The
// controller ranks the same nodes by kept per-node scores and filters
// best first (controller/planner/choice_quick.go); TestQuickChoiceMatchesExhaustive
// holds that to be the same choice as ChooseNode over the filtered nodes,
// which is what is called here.
//
// hostAware gives the allocator each node's CPU and memory left and the
// recent GPU pods' shapes (allocate.DemandHistory, same window and
// refresh as the controller's, each pod counted once placed, as the controller records it): nodes are then ranked
// by the GPU a placement strands first (Policy.Demand), each shape also
// weighed by how few nodes could run it (DemandMix.WithScarcity). The history
// knows the list's GPU task shapes from the start (DemandHistory.Know,
// a pseudo-count of one each, not their frequencies): FGD is given the
// same list's classes with their frequencies as its target workload M,
// and a controller would know the shapes of the pods already running.
//
// CPU-only tasks carry no claim. With cpuOnly unset they are placed by
// allocate.ChooseHost over the same demand mix (gpulink placing the pods
// without GPUs too); otherwise by the function given, kube-scheduler's
// scoring for the configurations that leave them to kube-scheduler.
type gpulinkPolicy struct {
	rng    *rand.Rand
	hist   *allocate.SizeHistory
	demand *allocate.DemandHistory
	buf    []*allocate.NodeState
	index  map[string]int
	// hostAware: ChooseNode sees Host and Demand.
	hostAware bool
	// cpuOnly, when set, places CPU-only tasks instead of ChooseHost.
	cpuOnly func(c *Cluster, t *Task) (Placement, bool, error)
	// nodesNow is demandMix's buffer of the GPU nodes; lastScarce is
	// lastMix weighed by their scarcity when it was snapshot.
	nodesNow            []*allocate.NodeState
	lastMix, lastScarce *allocate.DemandMix
	// heldSize is the size mix in use (allocate.HoldSize).
	heldSize *allocate.SizeMix
}

func newGpulinkPolicy(w *Workload, rng *rand.Rand, hostAware bool, cpuOnly func(c *Cluster, t *Task) (Placement, bool, error)) (*gpulinkPolicy, error) {
	h, err := allocate.NewSizeHistory(allocate.DefaultHistoryWindow, allocate.DefaultHistoryRefresh)
	if err != nil {
		return nil, err
	}
	d, err := allocate.NewDemandHistory(allocate.DefaultHistoryWindow, allocate.DefaultDemandRefresh)
	if err != nil {
		return nil, err
	}
	if w != nil {
		for _, m := range w.classes {
			s := allocate.DemandShape{GPUs: m.gpus, Host: allocate.Host{CPUMilli: m.cpu, MemoryBytes: m.mem << 20},
				Products: allocate.ProductsKey(m.models)}
			if m.milli < MilliPerGPU {
				s.ShareMilli = int(m.milli)
			}
			if err := d.Know(s); err != nil {
				return nil, fmt.Errorf("gpulink: task class %+v: %w", m, err)
			}
		}
	}
	return &gpulinkPolicy{rng: rng, hist: h, demand: d, hostAware: hostAware, cpuOnly: cpuOnly}, nil
}

// hostOf is a task's CPU and memory in the allocator's terms.
func hostOf(t *Task) allocate.Host {
	return allocate.Host{CPUMilli: t.CPUMilli, MemoryBytes: t.MemoryMiB << 20}
}

// shareRequest is a share of m milli GPU in gpulink's terms: m/1000 of the
// (nominal) memory and m/10 % of the cores.
func shareRequest(milli int) *allocate.ShareRequest {
	return &allocate.ShareRequest{MemoryBytes: int64(milli) * nominalShareUnit, Cores: int64(milli / shareGranularity)}
}

func (g *gpulinkPolicy) place(c *Cluster, t *Task) (Placement, bool, error) {
	if g.index == nil {
		g.index = make(map[string]int, len(c.nodes))
		var products []string
		for i, n := range c.nodes {
			g.index[n.spec.Name] = i
			if n.kind != nil {
				products = append(products, n.spec.Model)
			}
		}
		// As the controller, which tells its demand history the products
		// of the GPU nodes it knows (controller/planner demandRecorder).
		if err := g.demand.AssumeProducts(products); err != nil {
			return Placement{}, false, fmt.Errorf("gpulink: %w", err)
		}
	}
	if t.GPUs == 0 {
		if g.cpuOnly != nil {
			return g.cpuOnly(c, t)
		}
		return g.placeHost(c, t)
	}
	g.buf = g.buf[:0]
	for _, n := range c.nodes {
		// n.fits also checks the GPUs; ChooseNode would skip nodes short
		// of GPUs anyway, so the choice is the same and cheaper.
		if n.kind != nil && n.fits(t) {
			g.buf = append(g.buf, n.alloc)
		}
	}
	var req allocate.Request
	shape := allocate.DemandShape{GPUs: t.GPUs, Host: hostOf(t), Products: allocate.ProductsKey(t.Models)}
	if t.Share() {
		req.Share = shareRequest(t.GPUMilli)
		shape.ShareMilli = t.GPUMilli
	} else {
		req.GPUs = t.GPUs
		g.hist.Record(t.GPUs)
	}
	if len(g.buf) == 0 {
		return Placement{}, false, nil
	}
	// The controller keeps a mix while new snapshots stay near it
	// (allocate.HoldSize, HoldDemand), and so does the replay.
	g.heldSize = allocate.HoldSize(g.heldSize, g.hist.Mix())
	pol := allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack, Mix: g.heldSize}
	if g.hostAware {
		req.Host = hostOf(t)
		pol.Demand = g.demandMix(c)
	}
	r, err := allocate.ChooseNode(g.buf, req, pol)
	if unsat := (*allocate.UnsatisfiableError)(nil); errors.As(err, &unsat) {
		return Placement{}, false, nil
	}
	if err != nil {
		return Placement{}, false, fmt.Errorf("gpulink: task %s: %w", t.Name, err)
	}
	i, ok := g.index[r.Node]
	if !ok {
		return Placement{}, false, fmt.Errorf("gpulink: task %s placed on unknown node %q", t.Name, r.Node)
	}
	// As the controller, which records a pod's shape once it decided it
	// (controller/planner demandRecorder.record): a pod that found no
	// node is not in the mix.
	if err := g.demand.Record(shape); err != nil {
		return Placement{}, false, fmt.Errorf("gpulink: task %s: %w", t.Name, err)
	}
	return Placement{Node: i, GPUs: r.GPUs}, true, nil
}

// placeHost places a CPU-only task with allocate.ChooseHost over every
// node, ranked against the recent GPU pods' shapes.
func (g *gpulinkPolicy) placeHost(c *Cluster, t *Task) (Placement, bool, error) {
	g.buf = g.buf[:0]
	for _, n := range c.nodes {
		g.buf = append(g.buf, n.alloc)
	}
	name, err := allocate.ChooseHost(g.buf, hostOf(t), allocate.Policy{Demand: g.demandMix(c)})
	if unsat := (*allocate.UnsatisfiableError)(nil); errors.As(err, &unsat) {
		return Placement{}, false, nil
	}
	if err != nil {
		return Placement{}, false, fmt.Errorf("gpulink: task %s: %w", t.Name, err)
	}
	return Placement{Node: g.index[name]}, true, nil
}

// demandMix is the recent shapes' mix weighed by the scarcity of the GPU
// that could serve each (allocate.DemandMix.WithScarcity, as the
// controller ranks): computed again, with the nodes as they are then,
// when the mix is refreshed.
func (g *gpulinkPolicy) demandMix(c *Cluster) *allocate.DemandMix {
	m := g.demand.Mix()
	if m == g.lastMix {
		return g.lastScarce
	}
	g.nodesNow = g.nodesNow[:0]
	for _, n := range c.nodes {
		if n.kind != nil {
			g.nodesNow = append(g.nodesNow, n.alloc)
		}
	}
	g.lastMix, g.lastScarce = m, allocate.HoldDemand(g.lastScarce, m.WithScarcity(g.nodesNow))
	return g.lastScarce
}
