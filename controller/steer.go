package controller

import (
	"context"
	"fmt"
	"sync"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/steer"
	"github.com/gpulink/gpulink/driver"
)

// Actions of gpulink_controller_steer_taint_writes_total.
const (
	steerActionAdd    = "add"
	steerActionRemove = "remove"
)

// steering is the controller's two writers of steering taints
// (controller/steer, docs/cpu-pods.md): free keeps steer.Taint on the GPU
// nodes with an idle GPU (Config.SteerCPUPods), scarce keeps
// steer.ScarceTaint on those of them kept whole for the scarce shapes of
// the demand mix (Config.SteerScarceNodes). Both are always built: a
// writer that is off removes the taints a previous run left, once at
// start-up.
type steering struct {
	free, scarce *steer.Reconciler
	// freeOn and scarceOn: the writer follows its condition (else it only
	// removes).
	freeOn, scarceOn bool
	// scarceOff says why the scarce taint, asked for, is kept on no node
	// ("" when it is on or was not asked for).
	scarceOff string
}

// enqueue asks both writers to check a node.
func (s *steering) enqueue(node string) {
	s.free.Enqueue(node)
	s.scarce.Enqueue(node)
}

// nodeChanged is for the node informer's handlers.
func (s *steering) nodeChanged(old, cur *corev1.Node) {
	s.free.NodeChanged(old, cur)
	s.scarce.NodeChanged(old, cur)
}

// run runs both writers until ctx ends.
func (s *steering) run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { s.free.Run(ctx) })
	wg.Go(func() { s.scarce.Run(ctx) })
	wg.Wait()
}

// newSteer sets up the writers of the steering taints. On, a node is
// checked whenever the usage of its gpulink devices changes (the ledger:
// claims allocated, assumed or released, by anyone), its pool is
// published again, or its taints change; with the scarce taint on, both
// also when the node's CPU or memory left changes, and every GPU node when
// the demand mix's weights change (Controller.demandChanged): both read
// the mix then (steerWant, steerScarceWant). Off, every node is
// checked once at start-up, so that the taints a previous run left are
// removed. The two writers share one token bucket.
func (c *Controller) newSteer(cfg Config) error {
	var freeOn bool
	switch cfg.SteerCPUPods {
	case steer.ModeTaint:
		freeOn = true
	case steer.ModeOff, "":
	default:
		return fmt.Errorf("controller config: steerCPUPods %q: want %s or %s", cfg.SteerCPUPods, steer.ModeTaint, steer.ModeOff)
	}
	// The scarce taint refines the first: it needs it, and the demand
	// mix of ranking by stranding to tell which shapes are scarce.
	scarceOn := cfg.SteerScarceNodes && freeOn && cfg.RankByStranding
	limiter, err := steer.NewLimiter(cfg.SteerWritesPerSecond, cfg.SteerBurst)
	if err != nil {
		return fmt.Errorf("controller config: %w", err)
	}
	writes := func(key string) func(added bool) {
		return func(added bool) {
			if added {
				c.metrics.SteerTaintWrites.WithLabelValues(key, steerActionAdd).Inc()
			} else {
				c.metrics.SteerTaintWrites.WithLabelValues(key, steerActionRemove).Inc()
			}
		}
	}
	free, err := steer.New(steer.Config{Client: c.client, Nodes: c.nodes, Taint: steer.Taint, Enabled: freeOn, Want: c.steerWant,
		Limiter: limiter, Writes: writes(steer.TaintKey)})
	if err != nil {
		return fmt.Errorf("controller config: %w", err)
	}
	scarce, err := steer.New(steer.Config{Client: c.client, Nodes: c.nodes, Taint: steer.ScarceTaint, Enabled: scarceOn,
		Want: c.steerScarceWant, Limiter: limiter, Writes: writes(steer.ScarceTaintKey)})
	if err != nil {
		return fmt.Errorf("controller config: %w", err)
	}
	c.steering = &steering{free: free, scarce: scarce, freeOn: freeOn, scarceOn: scarceOn}
	switch {
	case cfg.SteerScarceNodes && !freeOn:
		c.steering.scarceOff = fmt.Sprintf("steerScarceNodes needs steerCPUPods %s (it is %q)", steer.ModeTaint, cfg.SteerCPUPods)
	case cfg.SteerScarceNodes && !cfg.RankByStranding:
		c.steering.scarceOff = "steerScarceNodes needs rankByStranding, whose demand mix tells which shapes are scarce (it is false)"
	}
	if freeOn {
		// gpulink's pools are named after their nodes
		// (sliceformat.CheckPoolNode).
		c.ledger.OnPoolChange(c.steering.enqueue)
	}
	return nil
}

// log says at start-up which steering taints are kept, and why the
// scarce one is not when it was asked for.
func (s *steering) log(ctx context.Context) {
	logger := klog.FromContext(ctx)
	if s.scarceOff != "" {
		logger.Info("Warning: the steering taint "+steer.ScarceTaintKey+" is kept on no node, and removed where a previous run left it", "reason", s.scarceOff)
	}
	logger.Info("Steering taints", "freeGPUs", s.freeOn, "scarceGPUs", s.scarceOn)
}

// steerWant: a node carries the steering taint while it has a gpulink GPU
// no claim holds any part of (planner.Ledger.HasIdleGPU). The replay
// measured this condition against others (any unallocated GPU capacity,
// GPU capacity some recent pod shape could still use) and it placed best
// (docs/performance/trace.md). With the scarce taint on, also while a
// shape of the demand mix that only a sliver of the cluster's GPU can
// hold could still run there, in the rest of a shared GPU
// (planner.Planner.KeptForScarce): on FGD's trace the shares pinned to
// a model with one GPU per node of 128 cores failed for CPU once pods
// without GPUs had spread over the node.
func (c *Controller) steerWant(node string) bool {
	if c.ledger.HasIdleGPU(c.inv.Node(node)) {
		return true
	}
	return c.steering.scarceOn && c.planner.KeptForScarce(node)
}

// steerScarceWant: a node carries the second steering taint while all
// of its GPUs are idle and a shape the demand mix weighs as scarce could
// run on it (planner.Planner.ReservedForScarce). On FGD's trace with
// GPU-model constraints this is what kept the 8-GPU pods that need most
// of a node's cores from failing below 100 % arrived: kube-scheduler
// spread pods without GPUs over those idle nodes when no node without the
// first taint fit them (docs/performance/trace.md).
func (c *Controller) steerScarceWant(node string) bool {
	return c.planner.ReservedForScarce(node)
}

// hostChanged is told of a node whose CPU or memory left (the pods
// counted there) or allocatable changed: ranking by stranding's kept
// scores of the node are stale, and whether it is kept for a scarce shape
// (either taint) may have changed.
func (c *Controller) hostChanged(node string) {
	c.ledger.Touch(node)
	if c.steering.scarceOn {
		c.steering.enqueue(node)
	}
}

// demandChanged is told, under the decision lock, that the demand mix's
// weights changed: which nodes a scarce shape needs (either taint) may
// have changed on every GPU node.
func (c *Controller) demandChanged() {
	if !c.steering.scarceOn {
		return
	}
	for _, n := range c.inv.All() {
		c.steering.enqueue(n.Node)
	}
}

// steerSlice checks the node of one of gpulink's slices after its pool
// was rebuilt (GPUs published, gone, or device taints changed).
func (c *Controller) steerSlice(slice *resourceapi.ResourceSlice) {
	if !c.steering.freeOn || slice.Spec.Driver != driver.Name {
		return
	}
	if slice.Spec.NodeName != nil {
		c.steering.enqueue(*slice.Spec.NodeName)
	}
}
