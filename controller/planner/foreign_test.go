package planner

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/allocate"
)

// switchRoots are the PCIe root complexes of pcie-switch-8's GPUs: each
// PIX pair hangs off a switch of its own root (the pairs reach each other
// through NODE or SYS).
var switchRoots = []string{"pci0000:00", "pci0000:00", "pci0000:20", "pci0000:20", "pci0000:80", "pci0000:80", "pci0000:a0", "pci0000:a0"}

// nicCluster is a Planner over pcie-switch-8 nodes ("n0", ...) with PCIe
// roots, each with the test NIC driver's devices nics[i], and an
// interpreter for the shipped classes and the NIC class.
func nicCluster(t testing.TB, nics ...[]controllertest.NIC) (*Planner, *Interpreter, *Inventory) {
	t.Helper()
	inv := NewInventory()
	nodes := nodeMap{}
	for i, ns := range nics {
		topo, err := controllertest.ParseFixture("pcie-switch-8.txt")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := controllertest.WithPCIeRoots(topo, switchRoots); err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("n%d", i)
		s, err := controllertest.Slice(name, topo, controllertest.SliceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := inv.Upsert(s); err != nil {
			t.Fatal(err)
		}
		if err := inv.Upsert(controllertest.NICSlice(name, ns)); err != nil {
			t.Fatal(err)
		}
		nodes[name] = controllertest.Node(name)
	}
	classes := controllertest.ClassLister{
		controllertest.NICClass: controllertest.NICDeviceClass(),
		"everything":            &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "everything"}},
		"bad-cel":               &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "bad-cel"}, Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{}}}},
	}
	for _, c := range DeviceClasses() {
		classes[c.Name] = c
	}
	sel := NewSelectorEvaluator()
	p, err := New(Config{Inventory: inv, Ledger: NewLedger(), Filter: &NodeFilter{Nodes: nodes, Classes: classes, Fit: NewFitTracker()}, Selectors: sel})
	if err != nil {
		t.Fatal(err)
	}
	return p, NewInterpreter(classes, sel, inv), inv
}

func nicClaim(name string, gpus, nics int64, mutate func(*resourceapi.DeviceClaim)) *resourceapi.ResourceClaim {
	dc := resourceapi.DeviceClaim{
		Requests:    []resourceapi.DeviceRequest{controllertest.WholeRequest("gpu", gpus), controllertest.NICRequest("nic", nics)},
		Constraints: []resourceapi.DeviceConstraint{controllertest.MatchPCIeRoot()},
	}
	if mutate != nil {
		mutate(&dc)
	}
	return &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "d", UID: types.UID(name + "-uid")},
		Spec: resourceapi.ResourceClaimSpec{Devices: dc}}
}

var noSchedule = []resourceapi.DeviceTaint{{Key: "example.com/maintenance", Value: "firmware", Effect: resourceapi.DeviceTaintEffectNoSchedule}}

// A claim for GPUs and another driver's NICs with matchAttribute pcieRoot
// gets GPUs whose root has enough free NICs (the first such GPU set in the
// allocator's order), NICs lowest name first; NICs held by other claims or
// with untolerated taints are not taken; when no GPU set admits them the
// waiting reasons say which NICs were missing under which GPUs.
func TestDecideGPUsWithNICs(t *testing.T) {
	numa := func(dc *resourceapi.DeviceClaim) {
		dc.Constraints[0].MatchAttribute = ptr.To(resourceapi.FullyQualifiedName("resource.kubernetes.io/numaNode"))
	}
	tolerate := func(dc *resourceapi.DeviceClaim) {
		dc.Requests[1].Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: "example.com/maintenance", Operator: resourceapi.DeviceTolerationOpExists}}
	}
	for _, tc := range []struct {
		name       string
		nics       []controllertest.NIC
		gpus, want int64
		mutate     func(*resourceapi.DeviceClaim)
		held       []string
		wantGPUs   string
		wantNICs   string
		wantWhy    string
	}{{
		name: "NICs under one root only",
		nics: []controllertest.NIC{nic("nic-0", "pci0000:00"), nic("nic-1", "pci0000:20"), nic("nic-2", "pci0000:80"), nic("nic-3", "pci0000:80")},
		gpus: 2, want: 2,
		wantGPUs: "gpu-4,gpu-5", wantNICs: "nic-2,nic-3",
	}, {
		name: "lowest names first",
		nics: []controllertest.NIC{nic("nic-z", "pci0000:00"), nic("nic-b", "pci0000:00"), nic("nic-a", "pci0000:00")},
		gpus: 2, want: 2,
		wantGPUs: "gpu-0,gpu-1", wantNICs: "nic-a,nic-b",
	}, {
		name: "held NICs are skipped",
		nics: []controllertest.NIC{nic("nic-0", "pci0000:00"), nic("nic-1", "pci0000:00"), nic("nic-2", "pci0000:20"), nic("nic-3", "pci0000:20")},
		held: []string{"nic-0"},
		gpus: 2, want: 2,
		wantGPUs: "gpu-2,gpu-3", wantNICs: "nic-2,nic-3",
	}, {
		name: "tainted NICs are avoided",
		nics: []controllertest.NIC{{Name: "nic-0", PCIeRoot: "pci0000:00", Taints: noSchedule}, {Name: "nic-1", PCIeRoot: "pci0000:00", Taints: noSchedule},
			nic("nic-2", "pci0000:a0"), nic("nic-3", "pci0000:a0")},
		gpus: 2, want: 2,
		wantGPUs: "gpu-6,gpu-7", wantNICs: "nic-2,nic-3",
	}, {
		name: "tolerated taints are not",
		nics: []controllertest.NIC{{Name: "nic-0", PCIeRoot: "pci0000:00", Taints: noSchedule}, {Name: "nic-1", PCIeRoot: "pci0000:00", Taints: noSchedule},
			nic("nic-2", "pci0000:a0"), nic("nic-3", "pci0000:a0")},
		gpus: 2, want: 2, mutate: tolerate,
		wantGPUs: "gpu-0,gpu-1", wantNICs: "nic-0,nic-1",
	}, {
		name: "NoExecute needs a toleration too",
		nics: []controllertest.NIC{{Name: "nic-0", PCIeRoot: "pci0000:00", Taints: []resourceapi.DeviceTaint{{Key: "k", Effect: resourceapi.DeviceTaintEffectNoExecute}}},
			nic("nic-1", "pci0000:20")},
		gpus: 1, want: 1,
		wantGPUs: "gpu-2", wantNICs: "nic-1",
	}, {
		name: "no constraint: any NICs of the node",
		nics: []controllertest.NIC{nic("nic-1", "pci0000:80"), nic("nic-0", "pci0000:20")},
		gpus: 2, want: 1, mutate: func(dc *resourceapi.DeviceClaim) { dc.Constraints = nil },
		wantNICs: "nic-0",
	}, {
		name: "matchAttribute numaNode (an int)",
		nics: []controllertest.NIC{{Name: "nic-0", PCIeRoot: "pci0000:00", NUMANode: ptr.To[int64](0)}, {Name: "nic-1", PCIeRoot: "pci0000:80", NUMANode: ptr.To[int64](1)}},
		gpus: 4, want: 1, mutate: numa,
		wantGPUs: "gpu-0,gpu-1,gpu-2,gpu-3", wantNICs: "nic-0",
	}, {
		name: "matchAttribute numaNode: the other NUMA node's NIC is free",
		nics: []controllertest.NIC{{Name: "nic-0", PCIeRoot: "pci0000:00", NUMANode: ptr.To[int64](0)}, {Name: "nic-1", PCIeRoot: "pci0000:80", NUMANode: ptr.To[int64](1)}},
		held: []string{"nic-0"},
		gpus: 4, want: 1, mutate: numa,
		wantGPUs: "gpu-4,gpu-5,gpu-6,gpu-7", wantNICs: "nic-1",
	}, {
		name: "one NIC per root: no 2 NICs under any GPU pair",
		nics: []controllertest.NIC{nic("nic-0", "pci0000:00"), nic("nic-1", "pci0000:20"), nic("nic-2", "pci0000:80")},
		gpus: 2, want: 2,
		wantWhy: "request nic: no 2 free devices of DeviceClass nic.test.example.com under resource.kubernetes.io/pcieRoot=pci0000:00 of gpu-0,gpu-1 on node n0",
	}, {
		name: "every NIC held",
		nics: []controllertest.NIC{nic("nic-0", "pci0000:00")},
		held: []string{"nic-0"},
		gpus: 1, want: 1,
		wantWhy: "request nic: node n0 has 0 free devices of DeviceClass nic.test.example.com",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			p, ip, _ := nicCluster(t, tc.nics)
			if len(tc.held) > 0 {
				var results []resourceapi.DeviceRequestAllocationResult
				for _, n := range tc.held {
					results = append(results, resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: controllertest.NICDriver, Pool: "n0", Device: n})
				}
				p.ledger.Observe(controllertest.ClaimWith("other-uid", "1", results...))
			}
			ic, kind, err := ip.Interpret(context.Background(), nicClaim("c", tc.gpus, tc.want, tc.mutate))
			if err != nil || kind != ClaimOurs {
				t.Fatalf("interpret: kind %v, err %v", kind, err)
			}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
			d := p.Decide(context.Background(), Request{Pod: pod, Pending: []*Claim{ic}})
			if tc.wantWhy != "" {
				if d.Chosen != nil {
					t.Fatalf("chose %s, want nothing", d.Chosen.Summarize())
				}
				msg := p.WaitingMessage([]*Claim{ic}, d)
				t.Log(msg)
				if !strings.Contains(msg, tc.wantWhy) {
					t.Fatalf("waiting message %q\nwant it to contain %q", msg, tc.wantWhy)
				}
				return
			}
			if d.Chosen == nil {
				t.Fatalf("nothing chosen: %s", p.WaitingMessage([]*Claim{ic}, d))
			}
			var gpus, nics []string
			for _, r := range d.Chosen.Claims[0] {
				for _, pos := range r.Positions {
					gpus = append(gpus, d.Chosen.Node.Devices[pos].Name)
				}
			}
			fr := d.Chosen.ForeignResults(0)
			if len(fr) != 1 || fr[0].Req.ResultName != "nic" {
				t.Fatalf("foreign results %+v: want one for request nic", fr)
			}
			for _, dev := range fr[0].Devices {
				if dev.Driver != controllertest.NICDriver || dev.Pool != "n0" {
					t.Errorf("NIC %s: driver %s pool %s", dev.Name, dev.Driver, dev.Pool)
				}
				nics = append(nics, dev.Name)
			}
			if tc.wantGPUs != "" && strings.Join(gpus, ",") != tc.wantGPUs {
				t.Errorf("GPUs %v, want %s (%s)", gpus, tc.wantGPUs, d.Chosen.Summarize())
			}
			if strings.Join(nics, ",") != tc.wantNICs {
				t.Errorf("NICs %v, want %s (%s)", nics, tc.wantNICs, d.Chosen.Summarize())
			}
			if !strings.Contains(d.Chosen.Summarize(), "nic="+tc.wantNICs+" ("+controllertest.NICDriver+")") {
				t.Errorf("summary %q does not name the NICs", d.Chosen.Summarize())
			}
		})
	}
}

// A node short of a claim's NICs fails once, before any GPU set is
// placed: the shortfall is its one reason, not one per GPU set tried
// (each of which ended on the same count), and no plan comes back.
func TestNICShortfallCheckedBeforeGPUSets(t *testing.T) {
	p, ip, inv := nicCluster(t, []controllertest.NIC{nic("nic-0", "pci0000:00"), nic("nic-1", "pci0000:20")})
	p.ledger.Observe(controllertest.ClaimWith("other-uid", "1",
		resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: controllertest.NICDriver, Pool: "n0", Device: "nic-0"},
		resourceapi.DeviceRequestAllocationResult{Request: "r", Driver: controllertest.NICDriver, Pool: "n0", Device: "nic-1"}))
	ic, kind, err := ip.Interpret(context.Background(), nicClaim("c", 1, 1, nil))
	if err != nil || kind != ClaimOurs {
		t.Fatalf("interpret: kind %v, err %v", kind, err)
	}
	n := inv.Node("n0")
	fn := &foreignNode{view: inv.Foreign("n0"), held: p.ledger.ForeignHeld, taken: map[DeviceKey]bool{}}
	plan, why := planNodeWith(context.Background(), p.sel, allocate.Policy{}, n, p.ledger.NodeUsage(n), []*Claim{ic}, fn)
	want := "request nic: node n0 has 0 free devices of DeviceClass nic.test.example.com that match its selectors and whose taints it tolerates, not 1"
	if plan != nil || len(why) != 1 || why[0] != want {
		t.Fatalf("plan %v, reasons %q: want none and only %q", plan != nil, why, want)
	}
	// With one NIC back the same node takes the claim.
	p.ledger.Forget("other-uid")
	fn = &foreignNode{view: inv.Foreign("n0"), held: p.ledger.ForeignHeld, taken: map[DeviceKey]bool{}}
	if plan, why := planNodeWith(context.Background(), p.sel, allocate.Policy{}, n, p.ledger.NodeUsage(n), []*Claim{ic}, fn); plan == nil {
		t.Fatalf("no plan with the NICs free: %q", why)
	}
}

// A node without the NICs is not chosen, however good its GPUs; two claims
// of one pod do not get the same NIC.
func TestDecideNICsAcrossNodesAndClaims(t *testing.T) {
	p, ip, _ := nicCluster(t, nil, []controllertest.NIC{nic("nic-0", "pci0000:00"), nic("nic-1", "pci0000:00"), nic("nic-2", "pci0000:20")})
	a, _, err := ip.Interpret(context.Background(), nicClaim("a", 1, 1, nil))
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := ip.Interpret(context.Background(), nicClaim("b", 1, 1, nil))
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
	d := p.Decide(context.Background(), Request{Pod: pod, Pending: []*Claim{a, b}})
	if d.Chosen == nil {
		t.Fatalf("nothing chosen: %s", p.WaitingMessage([]*Claim{a, b}, d))
	}
	if d.Chosen.Node.Node != "n1" {
		t.Fatalf("chose %s, want n1, the node with NICs", d.Chosen.Summarize())
	}
	var names []string
	for i := range 2 {
		for _, r := range d.Chosen.ForeignResults(i) {
			for _, dev := range r.Devices {
				names = append(names, dev.Name)
			}
		}
	}
	if len(names) != 2 || names[0] == names[1] {
		t.Fatalf("NICs %v: want two distinct", names)
	}
}

// What gpulink cannot evaluate exactly in a claim that mixes its GPUs with
// other drivers' devices is refused, naming the field and value.
func TestInterpretForeignRefusals(t *testing.T) {
	_, ip, _ := nicCluster(t, nil)
	for _, tc := range []struct {
		name   string
		mutate func(*resourceapi.DeviceClaim)
		want   string
	}{{
		name:   "admin access",
		mutate: func(dc *resourceapi.DeviceClaim) { dc.Requests[1].Exactly.AdminAccess = ptr.To(true) },
		want:   "spec.devices.requests[1].exactly.adminAccess",
	}, {
		name: "allocationMode All",
		mutate: func(dc *resourceapi.DeviceClaim) {
			dc.Requests[1].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
		},
		want: `spec.devices.requests[1].exactly.allocationMode: Unsupported value: "All"`,
	}, {
		name: "capacity",
		mutate: func(dc *resourceapi.DeviceClaim) {
			dc.Requests[1].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"bandwidth": resource.MustParse("10G")}}
		},
		want: "spec.devices.requests[1].exactly.capacity.requests: Forbidden: gpulink does not consume capacity (bandwidth)",
	}, {
		name: "firstAvailable",
		mutate: func(dc *resourceapi.DeviceClaim) {
			dc.Requests[1] = resourceapi.DeviceRequest{Name: "nic", FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: controllertest.NICClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}
		},
		want: "spec.devices.requests[1].firstAvailable: Forbidden",
	}, {
		name: "firstAvailable mixing drivers",
		mutate: func(dc *resourceapi.DeviceClaim) {
			dc.Requests[1] = resourceapi.DeviceRequest{Name: "nic", FirstAvailable: []resourceapi.DeviceSubRequest{
				{Name: "a", DeviceClassName: controllertest.NICClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1},
				{Name: "b", DeviceClassName: "gpu.gpulink.dev", AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 1}}}
		},
		want: "mix gpulink device classes with other drivers' classes",
	}, {
		name: "distinctAttribute",
		mutate: func(dc *resourceapi.DeviceClaim) {
			dc.Constraints = []resourceapi.DeviceConstraint{{DistinctAttribute: ptr.To(resourceapi.FullyQualifiedName("resource.kubernetes.io/pcieRoot"))}}
		},
		want: "spec.devices.constraints[0].distinctAttribute",
	}, {
		name:   "count too large",
		mutate: func(dc *resourceapi.DeviceClaim) { dc.Requests[1].Exactly.Count = 65 },
		want:   "spec.devices.requests[1].exactly.count: Invalid value: 65",
	}, {
		name: "selector that does not compile",
		mutate: func(dc *resourceapi.DeviceClaim) {
			dc.Requests[1].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "device.attributes["}}}
		},
		want: "spec.devices.requests[1].exactly.selectors[0].cel.expression",
	}, {
		name:   "class without selectors",
		mutate: func(dc *resourceapi.DeviceClaim) { dc.Requests[1].Exactly.DeviceClassName = "everything" },
		want:   `spec.devices.requests[1].exactly.deviceClassName: Invalid value: "everything"`,
	}, {
		name:   "class gpulink cannot evaluate",
		mutate: func(dc *resourceapi.DeviceClaim) { dc.Requests[1].Exactly.DeviceClassName = "bad-cel" },
		want:   "spec.devices.requests[1].exactly.deviceClassName: DeviceClass bad-cel: spec.selectors[0]",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ip.Interpret(context.Background(), nicClaim("c", 1, 1, tc.mutate))
			var u *uninterpretableError
			if !errors.As(err, &u) {
				t.Fatalf("err %v, want an uninterpretable claim", err)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %q\nwant it to contain %q", err, tc.want)
			}
		})
	}
	// A missing class is waited for, as for gpulink's classes.
	_, _, err := ip.Interpret(context.Background(), nicClaim("c", 1, 1, func(dc *resourceapi.DeviceClaim) { dc.Requests[1].Exactly.DeviceClassName = "missing" }))
	if !errors.Is(err, ErrClassMissing) {
		t.Fatalf("missing class: err %v, want ErrClassMissing", err)
	}
}

// A pod waiting for NICs of a pool gpulink does not use (its newest
// generation is incomplete) is told so in the waiting message.
func TestDecideNamesUnusedForeignPool(t *testing.T) {
	p, ip, inv := nicCluster(t, []controllertest.NIC{nic("nic-0", "pci0000:00")})
	next := controllertest.NICSlice("n0", []controllertest.NIC{nic("nic-0", "pci0000:00")})
	next.Spec.Pool.Generation, next.Spec.Pool.ResourceSliceCount = 2, 2
	if err := inv.Upsert(next); err != nil {
		t.Fatal(err)
	}
	ic, _, err := ip.Interpret(context.Background(), nicClaim("c", 1, 1, nil))
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
	d := p.Decide(context.Background(), Request{Pod: pod, Pending: []*Claim{ic}})
	if d.Chosen != nil {
		t.Fatalf("chose %s while the NIC pool is incomplete", d.Chosen.Summarize())
	}
	msg := p.WaitingMessage([]*Claim{ic}, d)
	if want := "other drivers' devices not used: pool n0 of driver " + controllertest.NICDriver + ": generation 2 has 1 of its 2 slices"; !strings.Contains(msg, want) {
		t.Fatalf("waiting message %q\nwant it to contain %q", msg, want)
	}
}
