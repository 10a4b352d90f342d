package planner

import (
	"context"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
)

// productNode publishes a node of fixture's topology whose GPUs name
// product.
func productNode(t *testing.T, inv *Inventory, node, fixture, product string) {
	t.Helper()
	topo, err := controllertest.ParseFixture(fixture)
	if err != nil {
		t.Fatal(err)
	}
	for p := range topo.GPUs {
		topo.GPUs[p].ProductName = product
	}
	s, err := controllertest.Slice(node, topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := inv.Upsert(s); err != nil {
		t.Fatal(err)
	}
}

const (
	productT4   = "Tesla T4"
	productV100 = "Tesla V100-SXM2-32GB"
	productA100 = "NVIDIA A100-SXM4-80GB"
)

func productIs(p string) string {
	return `device.attributes["` + driver.Name + `"].productName == "` + p + `"`
}

// A request's selectors admit the products on whose nodes some device
// passes them, however they test the product; selectors that admit every
// product, or none, say nothing (""); a new product changes the answer.
func TestProductAdmission(t *testing.T) {
	inv := NewInventory()
	productNode(t, inv, "a", "pcie-4.txt", productT4)
	productNode(t, inv, "b", "pcie-4.txt", productT4)
	productNode(t, inv, "c", "v100-sxm2-8-aliyun-sccgn6.txt", productV100)
	productNode(t, inv, "d", "dgx-a100.txt", productA100)
	a := newProductAdmission(inv, NewSelectorEvaluator())
	ctx := context.Background()
	for _, tc := range []struct {
		name      string
		selectors []string
		want      string
	}{
		{"no selectors", nil, ""},
		{"the driver only", []string{`device.driver == "` + driver.Name + `"`}, ""},
		{"one product", []string{productIs(productT4)}, productT4},
		{"a list of products", []string{`device.attributes["` + driver.Name + `"].productName in ["` + productT4 + `", "` + productA100 + `"]`}, allocate.ProductsKey([]string{productT4, productA100})},
		{"all but one", []string{`device.attributes["` + driver.Name + `"].productName != "` + productV100 + `"`}, allocate.ProductsKey([]string{productT4, productA100})},
		{"a prefix", []string{`device.attributes["` + driver.Name + `"].productName.startsWith("Tesla")`}, allocate.ProductsKey([]string{productT4, productV100})},
		{"the class's and the request's selectors together", []string{`device.attributes["` + driver.Name + `"].productName.startsWith("Tesla")`, productIs(productV100)}, productV100},
		{"none", []string{productIs("NVIDIA H100 80GB HBM3")}, ""},
	} {
		if got := a.of(ctx, tc.selectors); got != tc.want {
			t.Errorf("%s: products %q, want %q", tc.name, got, tc.want)
		}
	}
	// An H100 node joins: "all but V100" now admits it too, and a
	// selector of H100 alone is no longer "none".
	productNode(t, inv, "e", "dgx-h100.txt", "NVIDIA H100 80GB HBM3")
	if got, want := a.of(ctx, []string{`device.attributes["` + driver.Name + `"].productName != "` + productV100 + `"`}), allocate.ProductsKey([]string{productT4, productA100, "NVIDIA H100 80GB HBM3"}); got != want {
		t.Errorf("after the H100 node: all but V100 admits %q, want %q", got, want)
	}
	if got := a.of(ctx, []string{productIs("NVIDIA H100 80GB HBM3")}); got != "NVIDIA H100 80GB HBM3" {
		t.Errorf("after the H100 node: H100 admits %q, want it alone", got)
	}
}

// A node whose GPUs name no product cannot be told apart by product: a
// selector admitting it counts as admitting any product.
func TestProductAdmissionUnnamedNode(t *testing.T) {
	inv := NewInventory()
	productNode(t, inv, "a", "pcie-4.txt", productT4)
	productNode(t, inv, "b", "pcie-4.txt", "")
	a := newProductAdmission(inv, NewSelectorEvaluator())
	ctx := context.Background()
	if got := a.of(ctx, []string{productIs(productT4)}); got != productT4 {
		t.Errorf("T4 only: %q, want %q", got, productT4)
	}
	if got := a.of(ctx, []string{`device.attributes["` + driver.Name + `"].productName != "` + productT4 + `"`}); got != "" {
		t.Errorf("all but T4, admitting the unnamed node: %q, want \"\"", got)
	}
}

// The start-up seed records a running pod's shape with the products its
// claim's selectors admit, so that a restarted controller weighs pinned
// demand as it did; without the interpreted claims it records none.
func TestSeedRecordsProducts(t *testing.T) {
	inv := NewInventory()
	productNode(t, inv, "a", "pcie-4.txt", productT4)
	productNode(t, inv, "b", "v100-sxm2-8-aliyun-sccgn6.txt", productV100)
	sel := NewSelectorEvaluator()
	p, err := New(Config{Inventory: inv, Ledger: NewLedger(), Filter: &NodeFilter{}, Selectors: sel, RankByStranding: true})
	if err != nil {
		t.Fatal(err)
	}
	req := controllertest.WholeRequest("g", 2)
	req.Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: productIs(productV100)}}}
	claim := &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "c", Namespace: "ns", UID: controllertest.UID(1)},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{req}}},
		Status: resourceapi.ResourceClaimStatus{Allocation: &resourceapi.AllocationResult{Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
			{Request: "g", Driver: driver.Name, Pool: "b", Device: "gpu-0"}, {Request: "g", Driver: driver.Name, Pool: "b", Device: "gpu-1"}}}}},
	}
	classes := controllertest.ClassLister{}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	ip := NewInterpreter(classes, sel, inv)
	ic, kind, err := ip.Interpret(context.Background(), claim)
	if err != nil || kind != ClaimOurs {
		t.Fatalf("interpreting the claim: kind %v, err %v", kind, err)
	}
	pod := runningPod("p")
	if n := p.Seed(context.Background(), []RunningPod{{Pod: pod, Claims: []*resourceapi.ResourceClaim{claim}, Interpreted: []*Claim{ic}}}); n != 1 {
		t.Fatalf("seeded %d pods, want 1", n)
	}
	// Besides the seeded pod, fewer than 256 pods: the cluster's products
	// are still assumed (TestDemandPolicyAssumesTheClustersProducts).
	shapes, _ := p.demand.hist.Mix().Shapes()
	want := []allocate.DemandShape{{GPUs: 1, Products: productT4}, {GPUs: 1, Products: productV100}, {GPUs: 2, Products: productV100}}
	if !slices.Equal(shapes, want) {
		t.Fatalf("seeded shapes %+v, want one of 2 GPUs pinned to %s besides the assumed products, %+v", shapes, productV100, want)
	}
}

func runningPod(name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", UID: controllertest.UID(2), CreationTimestamp: metav1.Now()}}
}

// A controller started on an empty cluster ranks from its first decision:
// before any pod, the demand mix counts each product the inventory has
// (allocate.DemandHistory.AssumeProducts), and a product joining is a new
// mix; nodes whose GPUs name no product add none.
func TestDemandPolicyAssumesTheClustersProducts(t *testing.T) {
	inv := NewInventory()
	productNode(t, inv, "a", "pcie-4.txt", productT4)
	productNode(t, inv, "b", "v100-sxm2-8-aliyun-sccgn6.txt", productV100)
	productNode(t, inv, "c", "pcie-4.txt", "")
	rec, err := newDemandRecorder(true)
	if err != nil {
		t.Fatal(err)
	}
	rec.products = newProductAdmission(inv, NewSelectorEvaluator())
	p := &Planner{inv: inv, filter: &NodeFilter{Fit: NewFitTracker()}, ledger: NewLedger(), usage: newUsageCache()}
	pol := rec.policy(allocate.Policy{}, p.nodesNowOf(inv.All()))
	if pol.Demand == nil {
		t.Fatal("before any pod: no demand mix, want the cluster's products assumed")
	}
	shapes, _ := pol.Demand.Shapes()
	want := []allocate.DemandShape{{GPUs: 1, Products: productT4}, {GPUs: 1, Products: productV100}}
	if !slices.Equal(shapes, want) {
		t.Fatalf("before any pod: shapes %+v, want %+v", shapes, want)
	}
	first := pol.Demand
	if again := rec.policy(allocate.Policy{}, p.nodesNowOf(inv.All())); again.Demand != first {
		t.Fatal("the same products: a new mix, want the one in use (every kept score stays valid)")
	}
	productNode(t, inv, "d", "dgx-a100.txt", productA100)
	next := rec.policy(allocate.Policy{}, p.nodesNowOf(inv.All()))
	if shapes, _ := next.Demand.Shapes(); len(shapes) != 3 {
		t.Fatalf("after an A100 node joined: shapes %+v, want three products", shapes)
	}
}
