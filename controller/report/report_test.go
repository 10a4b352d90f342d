package report_test

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

const gib = int64(1) << 30

// reportSlice publishes a topology fixture for node the way the kubelet
// plugin does (sliceformat.Encode via controllertest),
// with 32Gi GPUs named product.
func reportSlice(t *testing.T, node, fixture, product string) *resourceapi.ResourceSlice {
	t.Helper()
	topo, err := topology.ParseFile(filepath.Join("..", "..", "driver", "topology", "testdata", fixture))
	if err != nil {
		t.Fatal(err)
	}
	for i := range topo.GPUs {
		topo.GPUs[i].ProductName = product
	}
	s, err := controllertest.Slice(node, topo, controllertest.SliceOptions{MemoryBytes: 32 * gib})
	if err != nil {
		t.Fatal(err)
	}
	return s
}

type result = resourceapi.DeviceRequestAllocationResult

func wholeResult(pool, dev string) result {
	return result{Request: "gpus", Driver: driver.Name, Pool: pool, Device: dev}
}

func shareResult(pool, dev, id, mem, cores string) result {
	r := wholeResult(pool, dev)
	uid := types.UID(id)
	r.ShareID = &uid
	r.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{
		driver.CapacityMemory: resource.MustParse(mem),
		driver.CapacityCores:  resource.MustParse(cores),
	}
	return r
}

// allocatedClaim is namespace/name allocated with results and reserved for pods.
func allocatedClaim(ns, name string, pods []string, results ...result) *resourceapi.ResourceClaim {
	c := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(ns + "-" + name)}}
	if len(results) > 0 {
		c.Status.Allocation = &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: results}}
	}
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{Resource: "pods", Name: p, UID: types.UID(p)})
	}
	return c
}

func findGPU(t *testing.T, r report.Node, dev string) report.GPU {
	t.Helper()
	for _, g := range r.GPUs {
		if g.Device == dev {
			return g
		}
	}
	t.Fatalf("node %s has no GPU %s", r.Name, dev)
	return report.GPU{}
}

func TestBuildReportHoldersAndFreeCapacity(t *testing.T) {
	v100 := reportSlice(t, "node-a", "v100-sxm2-8-aliyun-sccgn6.txt", "Tesla V100-SXM2-32GB")
	pcie := reportSlice(t, "node-b", "pcie-4.txt", "Tesla P40")
	// Another driver's slice on the same node must not disturb node-a.
	foreign := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "node-a-other"},
		Spec: resourceapi.ResourceSliceSpec{Driver: "other.example.com", Pool: resourceapi.ResourcePool{Name: "node-a", ResourceSliceCount: 1}, NodeName: ptr.To("node-a"),
			Devices: []resourceapi.Device{{Name: "nic-0"}}},
	}
	otherDriver := wholeResult("node-a", "gpu-7")
	otherDriver.Driver = "other.example.com"
	admin := wholeResult("node-a", "gpu-6")
	admin.AdminAccess = ptr.To(true)
	claims := []*resourceapi.ResourceClaim{
		allocatedClaim("team-a", "train", []string{"train-0"}, wholeResult("node-a", "gpu-3"), wholeResult("node-a", "gpu-0")),
		allocatedClaim("team-b", "infer", []string{"infer-0", "infer-1"}, shareResult("node-a", "gpu-1", "s-2", "4Gi", "25")),
		allocatedClaim("team-a", "notebook", []string{"nb"}, shareResult("node-a", "gpu-1", "s-1", "2Gi", "10")),
		allocatedClaim("team-c", "p40", nil, wholeResult("node-b", "gpu-2")),
		allocatedClaim("team-c", "pending", nil),
		allocatedClaim("team-c", "foreign", []string{"x"}, otherDriver, admin),
		nil,
	}
	reports := report.Build([]*resourceapi.ResourceSlice{pcie, foreign, v100}, claims)

	if len(reports) != 2 || reports[0].Name != "node-a" || reports[1].Name != "node-b" {
		t.Fatalf("reports for %v, want node-a then node-b", reportNames(reports))
	}
	a := reports[0]
	if a.Problem != "" || a.Pool != "node-a" || len(a.GPUs) != 8 || len(a.UnknownDevices) != 0 {
		t.Fatalf("node-a: problem %q, pool %q, %d GPUs, unknown %v", a.Problem, a.Pool, len(a.GPUs), a.UnknownDevices)
	}
	for i, g := range a.GPUs {
		if g.Index != i || g.Device != driver.DeviceName(i) {
			t.Errorf("GPU %d is %s (index %d), want GPUs in index order", i, g.Device, g.Index)
		}
		if g.Product != "Tesla V100-SXM2-32GB" || g.MemoryBytes != 32*gib || g.Cores != 100 {
			t.Errorf("%s: product %q memory %d cores %d, want the published values", g.Device, g.Product, g.MemoryBytes, g.Cores)
		}
		if len(g.Taints) != 0 || len(g.Problems) != 0 {
			t.Errorf("%s: taints %v problems %v, want none (the managed taint is not shown)", g.Device, g.Taints, g.Problems)
		}
	}
	// The link matrix is the fixture's, decoded back from the links attributes.
	if a.Topology == nil || a.Topology.Len() != 8 {
		t.Fatalf("node-a topology %v, want 8 GPUs", a.Topology)
	}
	if got := a.Topology.Link(0, 3).String(); got != "NV2" {
		t.Errorf("GPU0-GPU3 link %s, want NV2 as in the fixture", got)
	}
	if got := a.Topology.Link(0, 4).String(); got != "SYS" {
		t.Errorf("GPU0-GPU4 link %s, want SYS as in the fixture", got)
	}

	train := report.ClaimRef{Namespace: "team-a", Name: "train", ReservedFor: []string{"pods/train-0"}}
	for _, dev := range []string{"gpu-0", "gpu-3"} {
		g := findGPU(t, a, dev)
		if !reflect.DeepEqual(g.Whole, []report.ClaimRef{train}) || len(g.Shares) != 0 {
			t.Errorf("%s held whole by %v, shares %v; want only %v", dev, g.Whole, g.Shares, train)
		}
		if g.Free || g.FreeMemoryBytes != 0 || g.FreeCores != 0 {
			t.Errorf("%s: free %v, %d bytes, %d cores; want nothing free", dev, g.Free, g.FreeMemoryBytes, g.FreeCores)
		}
	}

	g1 := findGPU(t, a, "gpu-1")
	wantShares := []report.ShareHolder{
		{Claim: report.ClaimRef{Namespace: "team-a", Name: "notebook", ReservedFor: []string{"pods/nb"}}, ShareID: "s-1", MemoryBytes: 2 * gib, Cores: 10},
		{Claim: report.ClaimRef{Namespace: "team-b", Name: "infer", ReservedFor: []string{"pods/infer-0", "pods/infer-1"}}, ShareID: "s-2", MemoryBytes: 4 * gib, Cores: 25},
	}
	if !reflect.DeepEqual(g1.Shares, wantShares) || len(g1.Whole) != 0 {
		t.Errorf("gpu-1 shares %+v whole %v, want %+v", g1.Shares, g1.Whole, wantShares)
	}
	if g1.Free || g1.FreeMemoryBytes != 26*gib || g1.FreeCores != 65 {
		t.Errorf("gpu-1: free %v, %d bytes, %d cores; want not whole-free, 26Gi and 65 cores left", g1.Free, g1.FreeMemoryBytes, g1.FreeCores)
	}

	// Results of other drivers and admin-access results hold nothing.
	for _, dev := range []string{"gpu-2", "gpu-6", "gpu-7"} {
		g := findGPU(t, a, dev)
		if !g.Free || g.FreeMemoryBytes != 32*gib || g.FreeCores != 100 || len(g.Whole)+len(g.Shares) != 0 {
			t.Errorf("%s: %+v, want free", dev, g)
		}
	}

	b := reports[1]
	if len(b.GPUs) != 4 || b.Topology.Link(0, 1).String() != "PIX" {
		t.Fatalf("node-b: %d GPUs, want the 4 of pcie-4.txt with GPU0-GPU1 PIX", len(b.GPUs))
	}
	if g := findGPU(t, b, "gpu-2"); len(g.Whole) != 1 || g.Whole[0].Name != "p40" || g.Whole[0].ReservedFor != nil {
		t.Errorf("node-b gpu-2 held by %v, want team-c/p40 reserved for nobody", g.Whole)
	}
}

func TestBuildReportInconsistencies(t *testing.T) {
	good := func() *resourceapi.ResourceSlice { return reportSlice(t, "node-a", "pcie-4.txt", "") }
	tainted := good()
	tainted.Spec.Devices[2].Taints = append(tainted.Spec.Devices[2].Taints, resourceapi.DeviceTaint{
		Key: "gpu.gpulink.dev/unhealthy", Value: "xid-79", Effect: resourceapi.DeviceTaintEffectNoExecute})
	incomplete := good()
	incomplete.Spec.Pool.ResourceSliceCount = 2
	// Two slices of one pool naming different nodes cannot be one node.
	split := good()
	split.Spec.Devices = split.Spec.Devices[:2]
	split2 := good()
	split2.Name = "second"
	split2.Spec.NodeName = ptr.To("node-z")
	split2.Spec.Devices = split2.Spec.Devices[2:]
	for _, s := range []*resourceapi.ResourceSlice{split, split2} {
		s.Spec.Pool.ResourceSliceCount = 2
	}
	empty := &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: "cpu-node-gpu.gpulink.dev"},
		Spec: resourceapi.ResourceSliceSpec{Driver: driver.Name, Pool: resourceapi.ResourcePool{Name: "cpu-node", Generation: 1, ResourceSliceCount: 1},
			NodeName: ptr.To("cpu-node"), Devices: []resourceapi.Device{}},
	}

	tests := []struct {
		name   string
		slices []*resourceapi.ResourceSlice
		claims []*resourceapi.ResourceClaim
		check  func(t *testing.T, reports []report.Node)
	}{
		{
			name:   "nothing published, nothing allocated",
			slices: nil,
			claims: []*resourceapi.ResourceClaim{allocatedClaim("ns", "idle", nil)},
			check: func(t *testing.T, reports []report.Node) {
				if len(reports) != 0 {
					t.Errorf("reports %v, want none", reportNames(reports))
				}
			},
		},
		{
			name:   "node without GPUs is shown without a problem",
			slices: []*resourceapi.ResourceSlice{empty},
			check: func(t *testing.T, reports []report.Node) {
				if len(reports) != 1 || reports[0].Name != "cpu-node" || reports[0].Problem != "" || len(reports[0].GPUs) != 0 || reports[0].Topology != nil {
					t.Errorf("reports %+v, want cpu-node with no GPUs and no problem", reports)
				}
			},
		},
		{
			name:   "double whole, whole plus share, and over-committed shares",
			slices: []*resourceapi.ResourceSlice{good()},
			claims: []*resourceapi.ResourceClaim{
				allocatedClaim("ns", "one", nil, wholeResult("node-a", "gpu-0")),
				allocatedClaim("ns", "two", nil, wholeResult("node-a", "gpu-0")),
				allocatedClaim("ns", "three", nil, wholeResult("node-a", "gpu-1"), shareResult("node-a", "gpu-2", "a", "30Gi", "60")),
				allocatedClaim("ns", "four", nil, shareResult("node-a", "gpu-1", "b", "1Gi", "1"), shareResult("node-a", "gpu-2", "c", "4Gi", "50")),
			},
			check: func(t *testing.T, reports []report.Node) {
				r := reports[0]
				if g := findGPU(t, r, "gpu-0"); len(g.Whole) != 2 || g.Whole[0].Name != "one" || !hasProblem(g, "held whole by 2 claims") {
					t.Errorf("gpu-0 whole %v problems %v, want both claims and a double-allocation problem", g.Whole, g.Problems)
				}
				if g := findGPU(t, r, "gpu-1"); g.Free || g.FreeMemoryBytes != 0 || g.FreeCores != 0 || !hasProblem(g, "held whole and shared at the same time (1 shares)") {
					t.Errorf("gpu-1 %+v, want nothing free and a whole-plus-share problem", g)
				}
				g2 := findGPU(t, r, "gpu-2")
				if g2.FreeMemoryBytes != 0 || g2.FreeCores != 0 {
					t.Errorf("gpu-2 free %d bytes %d cores, want clamped to 0", g2.FreeMemoryBytes, g2.FreeCores)
				}
				if !hasProblem(g2, "shares take 36507222016 bytes of memory, the GPU has 34359738368") || !hasProblem(g2, "shares take 110 cores, the GPU has 100") {
					t.Errorf("gpu-2 problems %v, want memory and cores over-commit", g2.Problems)
				}
				if g := findGPU(t, r, "gpu-3"); !g.Free || len(g.Problems) != 0 {
					t.Errorf("gpu-3 %+v, want free without problems", g)
				}
			},
		},
		{
			name:   "held device the node no longer publishes",
			slices: []*resourceapi.ResourceSlice{good()},
			claims: []*resourceapi.ResourceClaim{
				allocatedClaim("ns", "ghost", []string{"p"}, wholeResult("node-a", "gpu-9"), shareResult("node-a", "gpu-10", "z", "1Gi", "5")),
			},
			check: func(t *testing.T, reports []report.Node) {
				want := []report.DeviceHold{
					{Device: "gpu-9", Claim: report.ClaimRef{Namespace: "ns", Name: "ghost", ReservedFor: []string{"pods/p"}}},
					{Device: "gpu-10", Claim: report.ClaimRef{Namespace: "ns", Name: "ghost", ReservedFor: []string{"pods/p"}}, Share: true, MemoryBytes: gib, Cores: 5},
				}
				if len(reports) != 1 || !reflect.DeepEqual(reports[0].UnknownDevices, want) {
					t.Errorf("unknown devices %+v, want %+v in device order", reports[0].UnknownDevices, want)
				}
			},
		},
		{
			name:   "claims hold devices of a pool without slices",
			slices: []*resourceapi.ResourceSlice{good()},
			claims: []*resourceapi.ResourceClaim{allocatedClaim("ns", "gone", nil, wholeResult("node-gone", "gpu-0"))},
			check: func(t *testing.T, reports []report.Node) {
				if len(reports) != 2 || reports[1].Name != "node-gone" {
					t.Fatalf("reports %v, want node-a and node-gone", reportNames(reports))
				}
				r := reports[1]
				if !strings.Contains(r.Problem, `pool "node-gone" publishes no ResourceSlices`) || len(r.UnknownDevices) != 1 || r.UnknownDevices[0].Claim.Name != "gone" {
					t.Errorf("node-gone: problem %q unknown %+v", r.Problem, r.UnknownDevices)
				}
			},
		},
		{
			name:   "incomplete pool generation",
			slices: []*resourceapi.ResourceSlice{incomplete},
			claims: []*resourceapi.ResourceClaim{allocatedClaim("ns", "held", nil, wholeResult("node-a", "gpu-1"))},
			check: func(t *testing.T, reports []report.Node) {
				r := reports[0]
				if r.Name != "node-a" || !strings.Contains(r.Problem, "incomplete: 1 of 2 slices published") || len(r.GPUs) != 0 || r.Topology != nil {
					t.Errorf("report %+v, want node-a with an incompleteness problem and no GPUs", r)
				}
				if len(r.UnknownDevices) != 1 || r.UnknownDevices[0].Device != "gpu-1" {
					t.Errorf("unknown devices %+v, want the held gpu-1", r.UnknownDevices)
				}
			},
		},
		{
			name:   "pool split over two nodes",
			slices: []*resourceapi.ResourceSlice{split2, split},
			check: func(t *testing.T, reports []report.Node) {
				if len(reports) != 1 || !strings.Contains(reports[0].Problem, "slices name nodes") {
					t.Errorf("reports %+v, want one problem naming both nodes", reports)
				}
				if reports[0].Name != "node-a" {
					t.Errorf("node %q, want node-a (named by the first slice)", reports[0].Name)
				}
			},
		},
		{
			name:   "device taints other than the managed taint are shown",
			slices: []*resourceapi.ResourceSlice{tainted},
			check: func(t *testing.T, reports []report.Node) {
				g := findGPU(t, reports[0], "gpu-2")
				if want := []string{"gpu.gpulink.dev/unhealthy=xid-79:NoExecute"}; !reflect.DeepEqual(g.Taints, want) {
					t.Errorf("gpu-2 taints %v, want %v", g.Taints, want)
				}
				// Nothing new is given out on a GPU tainted NoExecute.
				if !g.Tainted || g.Free || g.FreeMemoryBytes != 0 || g.FreeCores != 0 {
					t.Errorf("gpu-2: tainted %v, free %v, free share capacity %d bytes / %d cores; want tainted and nothing free",
						g.Tainted, g.Free, g.FreeMemoryBytes, g.FreeCores)
				}
				if other := findGPU(t, reports[0], "gpu-1"); other.Tainted || !other.Free {
					t.Errorf("gpu-1 (untainted, idle): tainted %v, free %v; want free", other.Tainted, other.Free)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.check(t, report.Build(tt.slices, tt.claims))
		})
	}
}

func hasProblem(g report.GPU, want string) bool {
	for _, p := range g.Problems {
		if p == want {
			return true
		}
	}
	return false
}

func reportNames(reports []report.Node) []string {
	var out []string
	for _, r := range reports {
		out = append(out, r.Name)
	}
	return out
}
