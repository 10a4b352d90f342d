package discovery

import (
	"context"

	"github.com/gpulink/gpulink/driver/topology"
)

// Discoverer finds the GPUs of this node.
type Discoverer interface {
	Discover(ctx context.Context) (*topology.Topology, error)
}
