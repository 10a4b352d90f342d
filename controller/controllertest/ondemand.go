package controllertest

import (
	"fmt"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// OnDemandSlices are the ResourceSlices of a simulated node of a go-nvml
// mock server (dgxa100, dgxh100, ...) whose GPUs in layout are in MIG mode
// with the instances listed, those of onDemand partitioned on demand (MIG
// on demand: published as partitions and counter sets, their instances
// left out), encoded as the kubelet plugin encodes them
// (sliceformat.EncodeSlices, managed by the controller).
func OnDemandSlices(tb testing.TB, server, node string, layout map[int][]string, onDemand ...int) []*resourceapi.ResourceSlice {
	tb.Helper()
	topo, err := discovery.MockTopology(server, discovery.MockOptions{MIG: layout})
	if err != nil {
		tb.Fatal(err)
	}
	for _, i := range onDemand {
		if i < 0 || i >= len(topo.GPUs) || !topo.GPUs[i].MIGEnabled() {
			tb.Fatalf("GPU %d: not a GPU of the layout in MIG mode", i)
		}
		topo.GPUs[i].MIG.OnDemand = true
	}
	encoded, err := sliceformat.EncodeSlices(klog.Background(), node, topo, sliceformat.Options{
		ManagedByController: true,
		DefaultShareMemory:  *resource.NewQuantity(4<<30, resource.BinarySI),
		DefaultShareCores:   25,
	})
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]*resourceapi.ResourceSlice, len(encoded))
	for i, s := range encoded {
		out[i] = &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", node, driverSliceSuffix, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         driver.Name,
				Pool:           resourceapi.ResourcePool{Name: node, Generation: 1, ResourceSliceCount: int64(len(encoded))},
				NodeName:       ptr.To(node),
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		}
	}
	return out
}
