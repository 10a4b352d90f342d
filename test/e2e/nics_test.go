//go:build e2e

package e2e_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
)

// nicPlugin is the test suite's own NIC driver on the real node: it
// publishes controllertest.NICDriver's devices through the kubelet plugin
// helper and, when the kubelet prepares a claim, records the NICs it was
// asked for (there is nothing to set up for a stand-in NIC, so no CDI
// device is returned).
type nicPlugin struct {
	t        *testing.T
	mu       sync.Mutex
	prepared map[types.UID][]string
}

func (p *nicPlugin) PrepareResourceClaims(_ context.Context, claims []*resourceapi.ResourceClaim) (map[types.UID]kubeletplugin.PrepareResult, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[types.UID]kubeletplugin.PrepareResult{}
	for _, c := range claims {
		var res kubeletplugin.PrepareResult
		for _, r := range c.Status.Allocation.Devices.Results {
			if r.Driver != controllertest.NICDriver {
				continue
			}
			res.Devices = append(res.Devices, kubeletplugin.Device{Requests: []string{r.Request}, PoolName: r.Pool, DeviceName: r.Device})
			p.prepared[c.UID] = append(p.prepared[c.UID], r.Device)
		}
		out[c.UID] = res
	}
	return out, nil
}

func (p *nicPlugin) UnprepareResourceClaims(_ context.Context, claims []kubeletplugin.NamespacedObject) (map[types.UID]error, error) {
	out := map[types.UID]error{}
	for _, c := range claims {
		out[c.UID] = nil
	}
	return out, nil
}

func (p *nicPlugin) HandleError(_ context.Context, err error, msg string) {
	p.t.Logf("NIC plugin: %s: %v", msg, err)
}

// WatchHealthStatus: a stand-in NIC has no health to report.
func (p *nicPlugin) WatchHealthStatus(context.Context, chan<- kubeletplugin.DeviceHealthReport) error {
	return kubeletplugin.ErrHealthNotSupported
}

func (p *nicPlugin) preparedFor(uid types.UID) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.prepared[uid])
}

// TestE2EGPUsWithNICs runs a pod whose claim asks for 2 gpulink GPUs and a
// NIC of another DRA driver (the suite's own, registered with the real
// node's kubelet) with matchAttribute resource.kubernetes.io/numaNode: the
// controller allocates the claim whole, GPUs of the NIC's NUMA node (the
// real node's fixture puts GPUs 4-7 on NUMA node 1, where the only NIC
// is) and the NIC as a result of its own driver; kube-scheduler binds the
// pod; the kubelet prepares the GPUs with gpulink's plugin and the NIC with
// the NIC driver's, and the pod runs.
func TestE2EGPUsWithNICs(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := setup(ctx, t)
	t.Logf("gpulink deployed %.1fs after the start", time.Since(begin).Seconds())

	plugin := &nicPlugin{t: t, prepared: map[types.UID][]string{}}
	pluginDir := filepath.Join(s.cluster.KubeletRootDir(), "plugins", controllertest.NICDriver)
	if err := os.MkdirAll(pluginDir, 0o750); err != nil {
		t.Fatal(err)
	}
	helper, err := kubeletplugin.Start(ctx, plugin,
		kubeletplugin.KubeClient(s.client),
		kubeletplugin.NodeName(s.realNode),
		kubeletplugin.DriverName(controllertest.NICDriver),
		kubeletplugin.RegistrarDirectoryPath(filepath.Join(s.cluster.KubeletRootDir(), "plugins_registry")),
		kubeletplugin.PluginDataDirectoryPath(pluginDir))
	if err != nil {
		t.Fatalf("starting the NIC driver's kubelet plugin: %v", err)
	}
	defer helper.Stop()
	nics := controllertest.NICSlice(s.realNode, []controllertest.NIC{{Name: "nic-0", NUMANode: ptr.To[int64](1)}})
	if err := helper.PublishResources(ctx, resourceslice.DriverResources{Pools: map[string]resourceslice.Pool{
		s.realNode: {Slices: []resourceslice.Slice{{Devices: nics.Spec.Devices}}},
	}}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.client.ResourceV1().DeviceClasses().Create(ctx, controllertest.NICDeviceClass(), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	_, err = s.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpus-nic"},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{
			Requests:    []resourceapi.DeviceRequest{controllertest.WholeRequest("gpus", 2), controllertest.NICRequest("nic", 1)},
			Constraints: []resourceapi.DeviceConstraint{controllertest.MatchNUMANode()},
		}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.pod(ctx, t, "rdma", "gpus-nic", s.realNode)
	h := s.waitBound(ctx, t, "rdma")
	var got []string
	for _, r := range h.claim.Status.Allocation.Devices.Results {
		if r.Driver == controllertest.NICDriver {
			got = append(got, r.Pool+"/"+r.Device)
		}
	}
	if want := []string{s.realNode + "/nic-0"}; !slices.Equal(got, want) {
		t.Errorf("NIC results %v, want %v", got, want)
	}
	for _, d := range h.Devices {
		if i := slices.Index([]string{"gpu-4", "gpu-5", "gpu-6", "gpu-7"}, d); i < 0 {
			t.Errorf("GPU %s is not on NUMA node 1, the NIC's (GPUs %s)", d, gpuview.Indexes(h.Devices))
		}
	}
	s.waitRunning(ctx, t, &h)
	if p := plugin.preparedFor(h.claim.UID); !slices.Equal(p, []string{"nic-0"}) {
		t.Errorf("the NIC driver's plugin prepared %v for the claim, want nic-0", p)
	}
	t.Logf("GPUs with a NIC e2e took %.1fs", time.Since(begin).Seconds())
}
