package controllertest

import (
	"fmt"
	"path/filepath"
	"runtime"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	apitypes "k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
)

// ClassLister serves DeviceClasses from a map: the controller's class
// lister, and the planner's class source, in tests.
type ClassLister map[string]*resourceapi.DeviceClass

// List returns every class.
func (f ClassLister) List(labels.Selector) ([]*resourceapi.DeviceClass, error) {
	var out []*resourceapi.DeviceClass
	for _, c := range f {
		out = append(out, c)
	}
	return out, nil
}

// Get returns the named class, or NotFound as a lister does.
func (f ClassLister) Get(name string) (*resourceapi.DeviceClass, error) {
	if c, ok := f[name]; ok {
		return c, nil
	}
	return nil, apierrors.NewNotFound(resourceapi.Resource("deviceclasses"), name)
}

// topologyTestdata is driver/topology/testdata, found from this file so
// that tests of any package can read the fixtures.
func topologyTestdata() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..", "driver", "topology", "testdata")
}

// ParseFixture parses one of driver/topology/testdata's topologies.
func ParseFixture(name string) (*topology.Topology, error) {
	return topology.ParseFile(filepath.Join(topologyTestdata(), name))
}

// UID returns a distinct claim UID for tests.
func UID(i int) apitypes.UID { return apitypes.UID(fmt.Sprintf("uid-%d", i)) }

// V100Slice is the slice of an eight-GPU V100 node (the NVLink hybrid
// cube mesh of v100-sxm2-8-aliyun-sccgn6.txt) named node.
func V100Slice(tb testing.TB, node string) *resourceapi.ResourceSlice {
	tb.Helper()
	topo, err := ParseFixture("v100-sxm2-8-aliyun-sccgn6.txt")
	return mustSlice(tb, node, topo, err)
}

// mustSlice is the slice of node with topology topo, failing the test
// when the topology could not be had (err) or encoded.
func mustSlice(tb testing.TB, node string, topo *topology.Topology, err error) *resourceapi.ResourceSlice {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	s, err := Slice(node, topo, SliceOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	return s
}

// EightGPUFixtures are the eight-GPU node kinds of the 5,000-node
// benchmarks: NVLink meshes, NVSwitch boxes and PCIe switch trees.
var EightGPUFixtures = []string{"dgx1-v100.txt", "dgx1-p100.txt", "dgx-a100.txt", "dgx-h100.txt",
	"v100-sxm2-8-aliyun-sccgn6.txt", "pcie-nvbridge-8.txt", "pcie-pex-8.txt", "pcie-switch-8.txt"}

// MixedEightGPUSlices returns one slice per node for n nodes named
// node-00000..., their kinds taken from EightGPUFixtures in turn.
func MixedEightGPUSlices(tb testing.TB, n int) []*resourceapi.ResourceSlice {
	tb.Helper()
	out := make([]*resourceapi.ResourceSlice, 0, n)
	for i := range n {
		topo, err := ParseFixture(EightGPUFixtures[i%len(EightGPUFixtures)])
		out = append(out, mustSlice(tb, fmt.Sprintf("node-%05d", i), topo, err))
	}
	return out
}

// ClaimWith is a claim with a UID and resourceVersion, allocated with
// results when there are any.
func ClaimWith(uid, rv string, results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{UID: apitypes.UID(uid), ResourceVersion: rv}}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	return c
}

// WholeResult is request "r"'s whole device dev of pool "n".
func WholeResult(dev string) resourceapi.DeviceRequestAllocationResult {
	return resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: driver.Name, Pool: "n", Device: dev}
}

// ShareResult is request "r"'s share of device dev of pool "n" with the
// memory and cores consumed.
func ShareResult(dev, mem, cores string) resourceapi.DeviceRequestAllocationResult {
	id := apitypes.UID("3f1c2a10-0000-4000-8000-" + dev[len(dev)-1:] + "00000000000")
	r := WholeResult(dev)
	r.ShareID = &id
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse(mem), "cores": resource.MustParse(cores)}
	return r
}

// MIGSlice is the slice of a simulated DGX A100 (the go-nvml mock) whose
// GPUs in layout are in MIG mode with the profiles listed.
func MIGSlice(tb testing.TB, node string, layout map[int][]string) *resourceapi.ResourceSlice {
	tb.Helper()
	return MockMIGSlice(tb, "dgxa100", node, layout)
}

// MockMIGSlice is the slice of a simulated node of a go-nvml mock server
// (dgxa100, dgxh100, ...) with a MIG layout.
func MockMIGSlice(tb testing.TB, server, node string, layout map[int][]string) *resourceapi.ResourceSlice {
	tb.Helper()
	topo, err := discovery.MockTopology(server, discovery.MockOptions{MIG: layout})
	return mustSlice(tb, node, topo, err)
}

// ProfileSelector is a CEL selector of MIG devices of one profile.
func ProfileSelector(profile string) string {
	return `device.attributes["` + driver.Name + `"].profile == "` + profile + `"`
}
