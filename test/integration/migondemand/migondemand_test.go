//go:build integration

// Package migondemand_test checks MIG on demand against a real
// kube-apiserver (test/localcluster): the ResourceSlices the kubelet
// plugin encodes for GPUs partitioned on demand (sliceformat.EncodeSlices
// on what NVML discovery finds on go-nvml's simulated DGX A100 and H100)
// are accepted under strict field validation, and the structured
// allocator kube-scheduler uses never gives out two partitions of one GPU
// that its counters say cannot coexist.
//
// Needs the binaries of hack/cluster.sh build in _output/bin (or
// $GPULINK_BIN_DIR). Run: go test -tags integration ./test/integration/migondemand/
package migondemand_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/client-go/kubernetes"
	"k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/dynamic-resource-allocation/structured"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/internal/sliceformat"
	"github.com/gpulink/gpulink/test/localcluster"
)

// node is a simulated GPU node: GPUs 0 and 1 in MIG mode without
// instances and partitioned on demand, GPU 2 in MIG mode with one static
// instance of the full profile, the others whole.
type node struct {
	name, server string
	// small and full are the profiles the allocation checks ask for: the
	// smallest (one compute slice, one memory slice) and the whole GPU.
	small, full string
}

var nodes = []node{
	{name: "a100-node", server: "dgxa100", small: "1g.5gb", full: "7g.40gb"},
	{name: "h100-node", server: "dgxh100", small: "1g.10gb", full: "7g.80gb"},
}

const namespace = "default"

func TestMIGOnDemandAgainstAPIServer(t *testing.T) {
	// Verbosity 2: the allocator logs every step at 5, ktesting's default.
	ctx := klog.NewContext(context.Background(), ktesting.NewLogger(t, ktesting.NewConfig(ktesting.Verbosity(2))))
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	dir, err := localcluster.MkdirTemp("glmig")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	cluster := localcluster.StartForTest(ctx, t, dir, localcluster.Options{})
	client := cluster.Client()
	createDeviceClasses(ctx, t, client)

	for _, n := range nodes {
		t.Run(n.server, func(t *testing.T) {
			gpus := publish(ctx, t, client, n)
			var gpu0 *mig.GPU
			for _, g := range gpus {
				if g.index == 0 {
					gpu0 = g.mig
				}
			}
			checkAllocation(ctx, t, client, n, gpu0)
		})
	}
}

// createDeviceClasses creates the project's DeviceClasses
// (deployments/deviceclasses/deviceclasses.yaml), mig.gpulink.dev among
// them, with strict field validation.
func createDeviceClasses(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	t.Helper()
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(root, "deployments", "deviceclasses", "deviceclasses.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := localcluster.DecodeObjects(manifest)
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, o := range objs {
		var class resourceapi.DeviceClass
		if err := runtime.DefaultUnstructuredConverter.FromUnstructuredWithValidation(o.Object, &class, true); err != nil {
			t.Fatalf("DeviceClass %s: %v", o.GetName(), err)
		}
		found = found || class.Name == driver.DeviceClassMIG
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, &class, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("creating DeviceClass %s: %v", class.Name, err)
		}
	}
	if !found {
		t.Fatalf("deviceclasses.yaml has no DeviceClass %s", driver.DeviceClassMIG)
	}
}

type onDemandGPU struct {
	index int
	mig   *mig.GPU
}

// publish encodes the node's slices as the kubelet plugin does, creates
// them as one pool with strict field validation and checks what the API
// server stored. It returns the GPUs partitioned on demand.
func publish(ctx context.Context, t *testing.T, client kubernetes.Interface, n node) []onDemandGPU {
	t.Helper()
	logger, _ := ktesting.NewTestContext(t)
	topo, err := discovery.MockTopology(n.server, discovery.MockOptions{MIG: map[int][]string{0: nil, 1: nil, 2: {n.full}}})
	if err != nil {
		t.Fatalf("MockTopology(%s): %v", n.server, err)
	}
	var onDemand []onDemandGPU
	for _, i := range []int{0, 1} {
		topo.GPUs[i].MIG.OnDemand = true
		onDemand = append(onDemand, onDemandGPU{index: topo.GPUs[i].Index, mig: topo.GPUs[i].MIG})
	}
	// The options the plugin runs with when gpulink's controller manages
	// the node and health monitoring may taint devices.
	encoded, err := sliceformat.EncodeSlices(logger, n.name, topo, sliceformat.Options{ManagedByController: true, MayTaint: true})
	if err != nil {
		t.Fatalf("EncodeSlices: %v", err)
	}
	for i, s := range encoded {
		obj := &resourceapi.ResourceSlice{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%s-%d", n.name, driver.Name, i)},
			Spec: resourceapi.ResourceSliceSpec{
				Driver:         driver.Name,
				Pool:           resourceapi.ResourcePool{Name: n.name, Generation: 1, ResourceSliceCount: int64(len(encoded))},
				NodeName:       ptr.To(n.name),
				Devices:        s.Devices,
				SharedCounters: s.SharedCounters,
			},
		}
		if _, err := client.ResourceV1().ResourceSlices().Create(ctx, obj, metav1.CreateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("the API server refused ResourceSlice %d of %d (%d devices, %d counter sets): %v", i, len(encoded), len(s.Devices), len(s.SharedCounters), err)
		}
	}

	stored := poolSlices(ctx, t, client, n.name)
	if len(stored) != len(encoded) {
		t.Fatalf("pool %s: %d slices stored, %d created", n.name, len(stored), len(encoded))
	}
	counterSets := map[string]resourceapi.CounterSet{}
	var devices []resourceapi.Device
	for _, s := range stored {
		if s.Spec.NodeName == nil || *s.Spec.NodeName != n.name {
			t.Errorf("slice %s: nodeName %v, want %s", s.Name, s.Spec.NodeName, n.name)
		}
		if len(s.Spec.SharedCounters) > 0 && len(s.Spec.Devices) > 0 {
			t.Errorf("slice %s has both devices and counter sets", s.Name)
		}
		if len(s.Spec.Devices) > resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures {
			t.Errorf("slice %s: %d devices, at most %d with counters or taints (the API's limit with advanced features)", s.Name, len(s.Spec.Devices), resourceapi.ResourceSliceMaxDevicesWithAdvancedFeatures)
		}
		for _, cs := range s.Spec.SharedCounters {
			counterSets[cs.Name] = cs
		}
		devices = append(devices, s.Spec.Devices...)
	}
	if len(counterSets) != len(onDemand) {
		t.Errorf("%d counter sets stored, want one per GPU on demand (%d)", len(counterSets), len(onDemand))
	}
	partitions := 0
	for _, d := range devices {
		if !driver.IsPartitionDeviceName(d.Name) {
			if len(d.ConsumesCounters) > 0 {
				t.Errorf("device %s is no partition but consumes counters", d.Name)
			}
			continue
		}
		partitions++
		if len(d.ConsumesCounters) != 1 {
			t.Errorf("partition %s: consumes %v, want one counter set", d.Name, d.ConsumesCounters)
			continue
		}
		set, ok := counterSets[d.ConsumesCounters[0].CounterSet]
		if !ok {
			t.Errorf("partition %s consumes from counter set %s, which the pool lacks", d.Name, d.ConsumesCounters[0].CounterSet)
			continue
		}
		for name := range d.ConsumesCounters[0].Counters {
			if _, ok := set.Counters[name]; !ok {
				t.Errorf("partition %s consumes counter %s, which counter set %s lacks", d.Name, name, set.Name)
			}
		}
	}
	want := 0
	for _, g := range onDemand {
		want += len(g.mig.Partitions())
	}
	if partitions != want {
		t.Errorf("%d partitions stored, want %d (every placement of every profile of the GPUs on demand)", partitions, want)
	}
	t.Logf("%s: the API server accepted %d slices: %d devices (%d partitions), %d counter sets", n.server, len(stored), len(devices), partitions, len(counterSets))
	return onDemand
}

func poolSlices(ctx context.Context, t *testing.T, client kubernetes.Interface, pool string) []*resourceapi.ResourceSlice {
	t.Helper()
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var out []*resourceapi.ResourceSlice
	for i := range list.Items {
		if list.Items[i].Spec.Driver == driver.Name && list.Items[i].Spec.Pool.Name == pool {
			out = append(out, &list.Items[i])
		}
	}
	return out
}

// checkAllocation drives the structured allocator that kube-scheduler
// uses (k8s.io/dynamic-resource-allocation/structured) with what the API
// server holds, one claim at a time, writing each allocation to the
// claim's status as the scheduler does, so that the next allocation sees
// it.
func checkAllocation(ctx context.Context, t *testing.T, client kubernetes.Interface, n node, gpu0 *mig.GPU) {
	t.Helper()
	k8sNode := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.name}}
	claimN := 0
	// allocate creates a claim for one partition of profile on GPU parent
	// and tries to allocate it; on success it stores the allocation and
	// returns the device name, else "".
	allocate := func(profile string, parent int, tolerate bool) string {
		t.Helper()
		claimN++
		claim := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d-%s", n.name, claimN, sanitize(profile)), Namespace: namespace},
			Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
				Name: "part",
				Exactly: &resourceapi.ExactDeviceRequest{
					DeviceClassName: driver.DeviceClassMIG,
					Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: fmt.Sprintf(
						`device.attributes[%q].%s == %q && device.attributes[%q].%s == %d`,
						driver.Name, driver.AttrMIGProfile, profile, driver.Name, driver.AttrParentIndex, parent)}}},
				},
			}}}},
		}
		if tolerate {
			claim.Spec.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{
				Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule,
			}}
		}
		created, err := client.ResourceV1().ResourceClaims(namespace).Create(ctx, claim, metav1.CreateOptions{FieldValidation: "Strict"})
		if err != nil {
			t.Fatalf("creating claim for %s on GPU %d: %v", profile, parent, err)
		}
		results, err := newAllocator(ctx, t, client).Allocate(ctx, k8sNode, []*resourceapi.ResourceClaim{created})
		if err != nil {
			t.Fatalf("allocating %s on GPU %d: %v", profile, parent, err)
		}
		if len(results) == 0 {
			return ""
		}
		created.Status.Allocation = &results[0]
		if _, err := client.ResourceV1().ResourceClaims(namespace).UpdateStatus(ctx, created, metav1.UpdateOptions{FieldValidation: "Strict"}); err != nil {
			t.Fatalf("storing the allocation of %s on GPU %d: %v", profile, parent, err)
		}
		return results[0].Devices.Results[0].Device
	}

	// The managed taint keeps kube-scheduler's allocator off partitions
	// unless a request tolerates it.
	if dev := allocate(n.small, 0, false); dev != "" {
		t.Errorf("%s on GPU 0 without tolerating %s got %s", n.small, driver.ManagedTaintKey, dev)
	}
	first := allocate(n.small, 0, true)
	if first == "" {
		t.Fatalf("%s on GPU 0 could not be allocated on an empty GPU", n.small)
	}
	if dev := allocate(n.full, 0, true); dev != "" {
		t.Errorf("%s on GPU 0 got %s although %s holds part of the GPU", n.full, dev, first)
	}
	// GPU 1 is empty: the whole-GPU profile fits there, so the refusal on
	// GPU 0 was the counters', not the selector's.
	if dev := allocate(n.full, 1, true); dev == "" {
		t.Errorf("%s on the empty GPU 1 could not be allocated", n.full)
	}
	if dev := allocate(n.small, 1, true); dev != "" {
		t.Errorf("%s on GPU 1 got %s although %s holds all of it", n.small, dev, n.full)
	}

	// Fill GPU 0 with the smallest profile: as many as NVML says the GPU
	// holds, on distinct placements, and not one more.
	wantSmall := 0
	for _, p := range gpu0.Profiles {
		if p.Profile.Name == n.small {
			wantSmall = p.MaxInstances
		}
	}
	if wantSmall == 0 {
		t.Fatalf("GPU 0 reports no instance count for %s", n.small)
	}
	got := sets.New(first)
	for range wantSmall + 1 {
		dev := allocate(n.small, 0, true)
		if dev == "" {
			break
		}
		if got.Has(dev) {
			t.Errorf("%s given out twice", dev)
		}
		got.Insert(dev)
	}
	if got.Len() != wantSmall {
		t.Errorf("GPU 0 took %d partitions of %s (%v), NVML says it holds %d", got.Len(), n.small, sets.List(got), wantSmall)
	}
	t.Logf("%s: GPU 0 took %d x %s (%v); %s refused after one %s; %s on an empty GPU allocated", n.server, got.Len(), n.small, sets.List(got), n.full, n.small, n.full)
}

// newAllocator is kube-scheduler's allocator over what the API server
// holds now: every ResourceSlice, DeviceClass and allocated claim.
func newAllocator(ctx context.Context, t *testing.T, client kubernetes.Interface) structured.Allocator {
	t.Helper()
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	classes, err := client.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	allocated := sets.New[structured.DeviceID]()
	for _, c := range claims.Items {
		if c.Status.Allocation == nil {
			continue
		}
		for _, r := range c.Status.Allocation.Devices.Results {
			allocated.Insert(structured.MakeDeviceID(r.Driver, r.Pool, r.Device))
		}
	}
	sliceList := make([]*resourceapi.ResourceSlice, len(slices.Items))
	for i := range slices.Items {
		sliceList[i] = &slices.Items[i]
	}
	// The DRA features kube-scheduler 1.37 runs with by default that
	// concern these devices: counters (beta, on) and device taints (GA).
	features := structured.Features{PartitionableDevices: true, DeviceTaints: true, PrioritizedList: true, AdminAccess: true}
	alloc, err := structured.NewAllocator(ctx, features, structured.AllocatedState{
		AllocatedDevices:         allocated,
		AllocatedSharedDeviceIDs: sets.New[structured.SharedDeviceID](),
		AggregatedCapacity:       structured.NewConsumedCapacityCollection(),
	}, classLister(classes.Items), sliceList, cel.NewCache(10, cel.Features{}))
	if err != nil {
		t.Fatalf("NewAllocator: %v", err)
	}
	return alloc
}

type classLister []resourceapi.DeviceClass

func (l classLister) List() ([]*resourceapi.DeviceClass, error) {
	out := make([]*resourceapi.DeviceClass, len(l))
	for i := range l {
		out[i] = &l[i]
	}
	return out, nil
}

func (l classLister) Get(name string) (*resourceapi.DeviceClass, error) {
	for i := range l {
		if l[i].Name == name {
			return &l[i], nil
		}
	}
	return nil, fmt.Errorf("DeviceClass %q not found", name)
}

// sanitize makes a profile name usable in an object name.
func sanitize(profile string) string {
	out := []byte(profile)
	for i, c := range out {
		if c == '.' || c == '+' {
			out[i] = '-'
		}
	}
	return string(out)
}
