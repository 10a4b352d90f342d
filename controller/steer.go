package controller

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/controller/steer"
	"github.com/gpulink/gpulink/driver"
)

// Actions of gpulink_controller_steer_taint_writes_total.
const (
	steerActionAdd    = "add"
	steerActionRemove = "remove"
)

// newSteer sets up the writer of the steering taint (Config.SteerCPUPods,
// controller/steer): on, a node is checked whenever the usage of its
// gpulink devices changes (the ledger: claims allocated, assumed or
// released, by anyone), its pool is published again, or its taints
// change; off, every node is checked once at start-up, so that the taints
// a previous run left are removed.
func (c *Controller) newSteer(cfg Config) error {
	var enabled bool
	switch cfg.SteerCPUPods {
	case steer.ModeTaint:
		enabled = true
	case steer.ModeOff, "":
	default:
		return fmt.Errorf("controller config: steerCPUPods %q: want %s or %s", cfg.SteerCPUPods, steer.ModeTaint, steer.ModeOff)
	}
	r, err := steer.New(steer.Config{Client: c.client, Nodes: c.nodes, Enabled: enabled, Want: c.steerWant,
		WritesPerSecond: cfg.SteerWritesPerSecond, Burst: cfg.SteerBurst,
		Writes: func(added bool) {
			if added {
				c.metrics.SteerTaintWrites.WithLabelValues(steerActionAdd).Inc()
			} else {
				c.metrics.SteerTaintWrites.WithLabelValues(steerActionRemove).Inc()
			}
		}})
	if err != nil {
		return fmt.Errorf("controller config: %w", err)
	}
	c.steer = r
	c.steerOn = enabled
	if enabled {
		// gpulink's pools are named after their nodes
		// (sliceformat.CheckPoolNode).
		c.ledger.OnPoolChange(r.Enqueue)
	}
	return nil
}

// steerWant: a node carries the steering taint while it has a gpulink GPU
// no claim holds any part of (planner.Ledger.HasIdleGPU). The replay
// measured this condition against others (any unallocated GPU capacity,
// GPU capacity some recent pod shape could still use) and it placed best
// (docs/performance/trace.md).
func (c *Controller) steerWant(node string) bool {
	return c.ledger.HasIdleGPU(c.inv.Node(node))
}

// steerSlice checks the node of one of gpulink's slices after its pool
// was rebuilt (GPUs published, gone, or device taints changed).
func (c *Controller) steerSlice(slice *resourceapi.ResourceSlice) {
	if !c.steerOn || slice.Spec.Driver != driver.Name {
		return
	}
	if slice.Spec.NodeName != nil {
		c.steer.Enqueue(*slice.Spec.NodeName)
	}
}
