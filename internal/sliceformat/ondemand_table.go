package sliceformat

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
)

// Table is the GPU's placement table (mig.Table) read from its counters
// and its partitions' consumption: what placement decisions and reports
// read instead of the counters, with the same rule.
func (g *OnDemandGPU) Table() (*mig.Table, error) {
	parts := make([]mig.Partition, len(g.Partitions))
	for j, p := range g.Partitions {
		parts[j] = mig.Partition{Placement: p.Placement, Profile: mig.Profile{
			Name:        p.Profile,
			GIProfileID: limitedProfileID(p.Consumes),
			GISlices:    int(p.Consumes[driver.CounterComputeSlices]),
			MemoryBytes: p.Consumes[driver.CounterMemory],
		}}
	}
	t, err := mig.NewTable(g.Capacity, parts)
	if err != nil {
		return nil, fmt.Errorf("GPU %d partitioned on demand (counter set %s): %w", g.Index, g.CounterSet, err)
	}
	return t, nil
}

// limitedProfileID reads the NVML profile ID of a partition's
// profile-<id>-instances counter; -1 when the GPU does not limit the
// profile's instances (the table needs the ID only to find the limit).
func limitedProfileID(consumes map[string]int64) int {
	for name := range consumes {
		rest, ok := strings.CutPrefix(name, "profile-")
		if !ok {
			continue
		}
		if id, ok := strings.CutSuffix(rest, "-instances"); ok {
			if n, err := strconv.Atoi(id); err == nil {
				return n
			}
		}
	}
	return -1
}
