//go:build integration

// Package kubeletplugin_test runs the gpulink kubelet plugin in-process
// against a real kube-apiserver (test/localcluster, API-only node) and
// drives it over its real gRPC socket the way the kubelet does.
//
// Needs the binaries of hack/cluster.sh build in _output/bin (or
// $GPULINK_BIN_DIR). Run: go test -tags integration ./test/integration/kubeletplugin/
package kubeletplugin_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2/ktesting"
	drapbv1 "k8s.io/kubelet/pkg/apis/dra/v1"
	cdiapi "tags.cncf.io/container-device-interface/pkg/cdi"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
	"github.com/gpulink/gpulink/test/localcluster"
)

// pluginSetup is where one in-process plugin keeps its files.
type pluginSetup struct {
	nodeName, pluginDir, registrarDir, cdiDir, driverRoot, mpsRoot string
	// baseSpec, when set, makes the plugin generate the base CDI spec
	// from driverRoot and fail to start without a driver there.
	baseSpec *kubeletplugin.BaseSpecOptions
}

// startPlugin runs the plugin with topology-file discovery (the 8 x V100
// fixture) until the test ends.
func startPlugin(ctx context.Context, t *testing.T, client kubernetes.Interface, s pluginSetup) {
	t.Helper()
	for _, d := range []string{s.pluginDir, s.registrarDir} {
		if err := os.MkdirAll(d, 0o750); err != nil {
			t.Fatal(err)
		}
	}
	disc, err := kubeletplugin.NewDiscoverer(kubeletplugin.DiscoveryOptions{
		Backend:               kubeletplugin.DiscoveryTopologyFile,
		TopologyFile:          filepath.Join("testdata", "v100-sxm2-8-aliyun-sccgn6.txt"),
		NodeName:              s.nodeName,
		GPUProduct:            "Tesla V100-SXM2-16GB",
		GPUMemory:             resource.MustParse("16Gi"),
		CUDAComputeCapability: "7.0",
		DriverVersion:         "535.104.05",
	})
	if err != nil {
		t.Fatal(err)
	}
	cdi, err := kubeletplugin.NewCDIDir(s.cdiDir)
	if err != nil {
		t.Fatal(err)
	}
	plugin, err := kubeletplugin.New(ctx, kubeletplugin.Options{
		NodeName:            s.nodeName,
		PluginDataDir:       s.pluginDir,
		RegistrarDir:        s.registrarDir,
		DriverRoot:          s.driverRoot,
		BaseSpec:            s.baseSpec,
		RequireDriver:       s.baseSpec != nil,
		ManagedByController: true,
		DefaultShareMemory:  resource.MustParse("4Gi"),
		DefaultShareCores:   25,
		RediscoverInterval:  time.Minute,
	}, kubeletplugin.Dependencies{
		Discoverer: disc,
		CDI:        cdi,
		MPS:        mps.NewManager(s.mpsRoot, mps.DirOnlyDaemon{}),
		BootID:     func() (string, error) { return "integration-boot", nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stopPlugin := context.WithCancel(ctx)
	runErr := make(chan error, 1)
	go func() { runErr <- plugin.Run(runCtx, client) }()
	t.Cleanup(func() {
		stopPlugin()
		if err := <-runErr; err != nil {
			t.Errorf("plugin: %v", err)
		}
	})
}

func TestKubeletPluginAgainstAPIServer(t *testing.T) {
	const nodeName = "gpu-node-1"
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()

	// Unix socket paths must stay below 108 bytes: keep the tree short.
	dir, err := os.MkdirTemp("", "glkp")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })

	cluster := localcluster.StartForTest(ctx, t, dir, localcluster.Options{})
	client := cluster.Client()
	if err := cluster.AddAPINode(ctx, nodeName); err != nil {
		// AddAPINode updates the new node's status without retrying on
		// a conflict with the controller-manager. The plugin needs only
		// the Node object (it owns the ResourceSlices), not its status.
		if !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
		if _, getErr := client.CoreV1().Nodes().Get(ctx, nodeName, metav1.GetOptions{}); getErr != nil {
			t.Fatalf("%v; node missing: %v", err, getErr)
		}
		t.Logf("ignoring AddAPINode status conflict, the node exists: %v", err)
	}

	pluginDir := filepath.Join(dir, "p")
	registrarDir := filepath.Join(dir, "r")
	cdiDir := filepath.Join(dir, "cdi")
	startPlugin(ctx, t, client, pluginSetup{
		nodeName:     nodeName,
		pluginDir:    pluginDir,
		registrarDir: registrarDir,
		cdiDir:       cdiDir,
		driverRoot:   filepath.Join(dir, "no-driver"), // no /dev/nvidia* here
		mpsRoot:      filepath.Join(dir, "mps"),
	})

	devices := waitForSlices(ctx, t, client, nodeName)
	checkDevices(t, devices)
	if _, err := os.Stat(filepath.Join(registrarDir, driver.Name+"-reg.sock")); err != nil {
		t.Errorf("registration socket: %v", err)
	}

	conn, err := grpc.NewClient("unix://"+filepath.Join(pluginDir, "dra.sock"), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	dra := drapbv1.NewDRAPluginClient(conn)

	createDeviceClass(ctx, t, client)
	whole := allocatedClaim(ctx, t, client, nodeName, "whole", []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpus", Driver: driver.Name, Pool: nodeName, Device: "gpu-0"},
		{Request: "gpus", Driver: driver.Name, Pool: nodeName, Device: "gpu-3"},
	})
	shareID := types.UID("5d6a3c1e-8f7b-4c2a-9e0d-1a2b3c4d5e6f")
	share := allocatedClaim(ctx, t, client, nodeName, "share", []resourceapi.DeviceRequestAllocationResult{{
		Request: "gpus", Driver: driver.Name, Pool: nodeName, Device: "gpu-5", ShareID: &shareID,
		ConsumedCapacity: map[resourceapi.QualifiedName]resource.Quantity{
			driver.CapacityMemory: resource.MustParse("2Gi"),
			driver.CapacityCores:  resource.MustParse("20"),
		},
	}})
	unknown := allocatedClaim(ctx, t, client, nodeName, "unknown", []resourceapi.DeviceRequestAllocationResult{
		{Request: "gpus", Driver: driver.Name, Pool: nodeName, Device: "gpu-42"},
	})

	resp, err := dra.NodePrepareResources(ctx, &drapbv1.NodePrepareResourcesRequest{Claims: []*drapbv1.Claim{
		claimRef(whole), claimRef(share), claimRef(unknown),
	}})
	if err != nil {
		t.Fatalf("NodePrepareResources: %v", err)
	}
	// The whole-GPU claim: two devices, each with its own CDI device first
	// (the kubelet names it by that in allocatedResourcesStatus), then the
	// claim's.
	wantID := "gpu.gpulink.dev/claim=" + string(whole.UID)
	r := resp.Claims[string(whole.UID)]
	if r == nil || r.Error != "" || len(r.Devices) != 2 {
		t.Fatalf("whole claim: %+v", r)
	}
	for _, d := range r.Devices {
		if d.PoolName != nodeName || !slices.Equal(d.CdiDeviceIds, []string{wantID + "-" + d.DeviceName, wantID}) || !slices.Equal(d.RequestNames, []string{"gpus"}) {
			t.Errorf("whole claim device %+v", d)
		}
	}
	if r := resp.Claims[string(share.UID)]; r == nil || r.Error != "" || len(r.Devices) != 1 || r.Devices[0].GetShareId() != string(shareID) {
		t.Fatalf("share claim: %+v", r)
	}
	if r := resp.Claims[string(unknown.UID)]; r == nil || !strings.Contains(r.Error, "gpu-42") || !strings.Contains(r.Error, "default/unknown") {
		t.Fatalf("claim with an unknown device: %+v", r)
	}

	// The CDI specs are there and valid for the CDI library.
	cache, err := cdiapi.NewCache(cdiapi.WithSpecDirs(cdiDir), cdiapi.WithAutoRefresh(false))
	if err != nil {
		t.Fatal(err)
	}
	if err := cache.Refresh(); err != nil {
		t.Fatalf("CDI specs invalid: %v", err)
	}
	dev := cache.GetDevice(wantID)
	if dev == nil {
		t.Fatalf("CDI device %s missing; have %v", wantID, cache.ListDevices())
	}
	env := strings.Join(dev.ContainerEdits.Env, " ")
	uuid0 := attrString(devices, "gpu-0", driver.AttrUUID)
	uuid3 := attrString(devices, "gpu-3", driver.AttrUUID)
	if !strings.Contains(env, "NVIDIA_VISIBLE_DEVICES="+uuid0+","+uuid3) {
		t.Errorf("whole claim env %q lacks NVIDIA_VISIBLE_DEVICES=%s,%s", env, uuid0, uuid3)
	}
	shareDev := cache.GetDevice("gpu.gpulink.dev/claim=" + string(share.UID))
	if shareDev == nil || !slices.Contains(shareDev.ContainerEdits.Env, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=2048M") {
		t.Errorf("share claim CDI device %+v", shareDev)
	}
	for _, d := range r.Devices {
		if dev := cache.GetDevice(wantID + "-" + d.DeviceName); dev == nil {
			t.Errorf("CDI device of %s missing; have %v", d.DeviceName, cache.ListDevices())
		}
	}
	// Two claim devices and three GPUs' (two whole, one shared).
	if n := len(cache.ListDevices()); n != 5 {
		t.Errorf("%d CDI devices %v, want 5 (none for the failed claim)", n, cache.ListDevices())
	}

	// Unprepare as the kubelet does, twice (idempotent).
	for range 2 {
		uresp, err := dra.NodeUnprepareResources(ctx, &drapbv1.NodeUnprepareResourcesRequest{Claims: []*drapbv1.Claim{
			claimRef(whole), claimRef(share), claimRef(unknown),
		}})
		if err != nil {
			t.Fatalf("NodeUnprepareResources: %v", err)
		}
		for uid, r := range uresp.Claims {
			if r.Error != "" {
				t.Errorf("unprepare %s: %s", uid, r.Error)
			}
		}
	}
	entries, err := os.ReadDir(cdiDir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("CDI directory not empty after unprepare: %v", entries)
	}
}

// waitForSlices waits until the node's pool is published and returns its devices.
func waitForSlices(ctx context.Context, t *testing.T, client kubernetes.Interface, nodeName string) []resourceapi.Device {
	t.Helper()
	var devices []resourceapi.Device
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{
			FieldSelector: resourceapi.ResourceSliceSelectorNodeName + "=" + nodeName,
		})
		if err != nil {
			return false, err
		}
		devices = nil
		for _, s := range list.Items {
			if s.Spec.Driver != driver.Name {
				continue
			}
			if s.Spec.Pool.Name != nodeName {
				return false, fmt.Errorf("slice %s in pool %q, want %q", s.Name, s.Spec.Pool.Name, nodeName)
			}
			devices = append(devices, s.Spec.Devices...)
		}
		return len(devices) == 8, nil
	})
	if err != nil {
		t.Fatalf("waiting for 8 published devices (have %d): %v", len(devices), err)
	}
	slices.SortFunc(devices, func(a, b resourceapi.Device) int { return strings.Compare(a.Name, b.Name) })
	return devices
}

func checkDevices(t *testing.T, devices []resourceapi.Device) {
	t.Helper()
	for i, d := range devices {
		if d.Name != driver.DeviceName(i) {
			t.Errorf("device %d named %s", i, d.Name)
		}
		if len(d.Taints) != 1 || d.Taints[0].Key != driver.ManagedTaintKey || d.Taints[0].Effect != resourceapi.DeviceTaintEffectNoSchedule {
			t.Errorf("%s: taints %+v", d.Name, d.Taints)
		}
		if d.AllowMultipleAllocations == nil || !*d.AllowMultipleAllocations {
			t.Errorf("%s: allowMultipleAllocations dropped", d.Name)
		}
		if p := d.Capacity[driver.CapacityMemory].RequestPolicy; p == nil || p.Default == nil || p.Default.String() != "4Gi" {
			t.Errorf("%s: memory request policy %+v", d.Name, p)
		}
		if attrString(devices, d.Name, driver.AttrUUID) == "" {
			t.Errorf("%s: no uuid", d.Name)
		}
	}
	if got := attrString(devices, "gpu-0", driver.AttrLinks); got != "X112SS2S" {
		t.Errorf("gpu-0 links %q, want X112SS2S", got)
	}
	if got := attrString(devices, "gpu-0", driver.AttrProductName); got != "Tesla V100-SXM2-16GB" {
		t.Errorf("gpu-0 productName %q", got)
	}
	if v := devices[0].Attributes[driver.AttrDriverVersion].VersionValue; v == nil || *v != "535.104.5" {
		t.Errorf("gpu-0 driverVersion %v, want 535.104.5", v)
	}
}

func attrString(devices []resourceapi.Device, device, name string) string {
	for _, d := range devices {
		if d.Name == device {
			if a, ok := d.Attributes[resourceapi.QualifiedName(name)]; ok && a.StringValue != nil {
				return *a.StringValue
			}
		}
	}
	return ""
}

func createDeviceClass(ctx context.Context, t *testing.T, client kubernetes.Interface) {
	t.Helper()
	_, err := client.ResourceV1().DeviceClasses().Create(ctx, &resourceapi.DeviceClass{
		ObjectMeta: metav1.ObjectMeta{Name: driver.DeviceClassWhole},
		Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{
			CEL: &resourceapi.CELDeviceSelector{Expression: `device.driver == "` + driver.Name + `"`},
		}}},
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
}

// allocatedClaim creates a claim and writes its allocation the way an
// external allocator (the gpulink controller) does.
func allocatedClaim(ctx context.Context, t *testing.T, client kubernetes.Interface, nodeName, name string, results []resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
	t.Helper()
	claims := client.ResourceV1().ResourceClaims(metav1.NamespaceDefault)
	c, err := claims.Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: "gpus",
			Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: driver.DeviceClassWhole,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           int64(len(results)),
				Tolerations: []resourceapi.DeviceToleration{{
					Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule,
				}},
			},
		}}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	c.Status.Allocation = &resourceapi.AllocationResult{
		Devices: resourceapi.DeviceAllocationResult{Results: results},
		NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchFields: []corev1.NodeSelectorRequirement{{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{nodeName}}},
		}}},
		AllocationTimestamp: &now,
	}
	c, err = claims.UpdateStatus(ctx, c, metav1.UpdateOptions{})
	if err != nil {
		t.Fatalf("writing the allocation of claim %s: %v", name, err)
	}
	if c.Status.Allocation == nil {
		t.Fatal(errors.New("allocation dropped by the API server"))
	}
	return c
}

func claimRef(c *resourceapi.ResourceClaim) *drapbv1.Claim {
	return &drapbv1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: string(c.UID)}
}
