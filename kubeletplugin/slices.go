package kubeletplugin

import (
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// driverResources is what the resourceslice controller publishes for the
// node: its devices and counter sets as sliceformat encodes them, in one
// pool named after the node.
func driverResources(logger klog.Logger, nodeName string, t *topology.Topology, opts sliceformat.Options) (resourceslice.DriverResources, error) {
	encoded, err := sliceformat.EncodeSlices(logger, nodeName, t, opts)
	if err != nil {
		return resourceslice.DriverResources{}, err
	}
	slices := make([]resourceslice.Slice, len(encoded))
	for i, s := range encoded {
		slices[i] = resourceslice.Slice{Devices: s.Devices, SharedCounters: s.SharedCounters}
	}
	return resourceslice.DriverResources{
		Pools: map[string]resourceslice.Pool{nodeName: {Slices: slices}},
	}, nil
}
