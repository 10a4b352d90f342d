package planner

import (
	"fmt"

	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// onDemandGPU is a GPU partitioned on demand (MIG on demand) as decisions
// read it: its partitions' placement table. Its partitions are among the
// node's MIG devices (NodeInventory.MIG, with OnDemand set), so that
// selectors, taints, matchAttribute and the writes treat them as MIG
// devices; what sets them apart is that one partition's allocation rules
// out those that overlap it (nodeplan_mig.go).
type onDemandGPU struct {
	Index int
	Table *mig.Table
	// Decoded is the GPU as its pool publishes it: the counters are the
	// API's rule, Table is the same rule on bitmasks (tests check both
	// agree).
	Decoded *sliceformat.OnDemandGPU
}

// addOnDemand adds a pool's GPUs partitioned on demand to the node: their
// tables, and their partitions as MIG devices.
func (n *NodeInventory) addOnDemand(gpus []sliceformat.OnDemandGPU) error {
	for i := range gpus {
		g := &gpus[i]
		t, err := g.Table()
		if err != nil {
			return err
		}
		od := &onDemandGPU{Index: g.Index, Table: t, Decoded: g}
		pos := len(n.OnDemand)
		n.OnDemand = append(n.OnDemand, od)
		for j := range g.Partitions {
			p := &g.Partitions[j]
			part, ok := t.Find(p.Profile, p.Placement.Start)
			if !ok {
				return fmt.Errorf("GPU %d: partition %s is not in its table", g.Index, p.Device.Name)
			}
			dev := p.Device
			n.MIG = append(n.MIG, &migDevice{
				Name:        dev.Name,
				Parent:      p.Parent,
				Profile:     p.Profile,
				Placement:   p.Placement,
				MemoryBytes: p.MemoryBytes,
				Taints:      dev.Taints,
				scheduling:  sliceformat.SchedulingTaints(dev.Taints),
				CEL:         celDevice(dev),
				OnDemand:    od,
				ODPos:       pos,
				Part:        part,
			})
		}
	}
	return nil
}
