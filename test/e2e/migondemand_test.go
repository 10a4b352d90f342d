//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin"
)

// onDemandNode is a simulated node whose GPU 0 is in MIG mode without
// instances and partitioned on demand (--mock-mig=0: --mig-on-demand=0).
type onDemandNode struct {
	server           string
	small, mid, full string // the 1g, 3g and 7g profiles
	partitions       int    // what GPU 0 publishes
}

var onDemandNodes = []onDemandNode{
	{server: "dgxa100", small: "1g.5gb", mid: "3g.20gb", full: "7g.40gb", partitions: 25},
	{server: "dgxh100", small: "1g.10gb", mid: "3g.40gb", full: "7g.80gb", partitions: 28},
}

// onDemandCapMinors are the /dev/nvidia-caps minors of GPU 0's GPU
// instances 0-6 and their compute instance 0 in the driver's capability
// table (3 + 9*GI, then 4 + 9*GI + CI): every instance the plugin may
// create there gets a stand-in node.
func onDemandCapMinors() []int {
	var m []int
	for gi := range 7 {
		m = append(m, 3+9*gi, 4+9*gi)
	}
	return m
}

// TestMIGOnDemandE2E runs pods on MIG partitions created on demand on a
// simulated DGX A100 (40GB) and DGX H100 (80GB) node, end to end: the real
// node's kubelet plugin runs with GPU 0 in MIG mode without instances and
// --mig-on-demand=0; a pod asking for a 1g and a 3g partition is placed by
// the controller, the plugin creates the two instances at the allocated
// placements (its log and checkpoint say so, its prepared_claims gauge
// counts the claim), the container sees their MIG-<uuid>s and capability
// nodes; a pod asking for a 7g waits with the controller's event while
// they are held; deleting the first pod destroys its instances and CDI
// spec, and the 7g pod is then placed and runs. The go-nvml mock keeps
// created instances in the plugin process's memory, as a GPU would.
func TestMIGOnDemandE2E(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	for _, n := range onDemandNodes {
		t.Run(n.server, func(t *testing.T) { testMIGOnDemand(t, n) })
	}
}

func testMIGOnDemand(t *testing.T, n onDemandNode) {
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	s := setupOpts(ctx, t, setupOptions{
		realPluginArgs: []string{"--discovery=mock", "--mock-server=" + n.server, "--mock-mig=0:", "--mig-on-demand=0"},
		realDevices:    7 + n.partitions,
		migCapMinors:   onDemandCapMinors(),
	})
	t.Logf("gpulink with a simulated on-demand MIG node (%s) deployed %.1fs after the start", n.server, time.Since(begin).Seconds())
	byProfile := func(name string, profiles ...string) {
		var reqs []resourceapi.DeviceRequest
		for i, p := range profiles {
			reqs = append(reqs, resourceapi.DeviceRequest{Name: fmt.Sprintf("part%d", i), Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: driver.DeviceClassMIG,
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.attributes["gpu.gpulink.dev"].profile == %q`, p),
				}}},
			}})
		}
		_, err := s.client.ResourceV1().ResourceClaimTemplates(ns).Create(ctx, &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: reqs}}},
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	byProfile("small-mid", n.small, n.mid)
	byProfile("full", n.full)

	s.pod(ctx, t, "small-mid", "small-mid", s.realNode)
	h := s.waitBound(ctx, t, "small-mid")
	if len(h.Devices) != 2 || !driver.IsPartitionDeviceName(h.Devices[0]) || !driver.IsPartitionDeviceName(h.Devices[1]) {
		t.Fatalf("claim holds %v, want two partitions of GPU 0", h.Devices)
	}
	s.waitRunning(ctx, t, &h)
	devs := s.checkCreated(t, h, 2)
	s.checkPartitionContainer(t, h, devs)
	if sc, err := scrapeMetrics(ctx, s.pluginMetrics); err != nil {
		t.Errorf("plugin metrics: %v", err)
	} else if v, ok := sc.value("gpulink_kubeletplugin_prepared_claims"); !ok || v != 1 {
		t.Errorf("gpulink_kubeletplugin_prepared_claims = %v (found %t), want 1", v, ok)
	}

	// The 7g needs the whole GPU: it waits while the 1g and 3g exist.
	s.pod(ctx, t, "full", "full", s.realNode)
	s.waitEvent(ctx, t, "no partition on node "+s.realNode)
	if p, err := s.client.CoreV1().Pods(ns).Get(ctx, "full", metav1.GetOptions{}); err != nil || p.Spec.NodeName != "" {
		t.Fatalf("pod full: %v, bound to %q while the 1g and 3g are held", err, p.Spec.NodeName)
	}

	// A graceful deletion, as a user's: the kubelet keeps the pod until it
	// has unprepared its claim (destroyed the partitions), so the 7g is
	// allocated only then. A forced one frees the claim at once: the 7g
	// was allocated while the 1g and 3g still existed, the plugin refused
	// it, and the kubelet retried after its back-off (65-85 s).
	claim := h.claim.Name
	if err := s.client.CoreV1().Pods(ns).Delete(ctx, "small-mid", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	s.waitDestroyed(ctx, t, claim, h.Devices)

	full := s.waitBound(ctx, t, "full")
	if want := []string{"gpu-0-part-" + strings.ReplaceAll(n.full, ".", "-") + "-at-0"}; !slices.Equal(full.Devices, want) {
		t.Fatalf("7g claim holds %v, want %v", full.Devices, want)
	}
	s.waitRunning(ctx, t, &full)
	s.checkPartitionContainer(t, full, s.checkCreated(t, full, 1))
	s.deletePodsAndWait(ctx, t)
	s.waitDestroyed(ctx, t, full.claim.Name, full.Devices)
	t.Logf("MIG on demand e2e (%s) took %.1fs", n.server, time.Since(begin).Seconds())
}

// checkCreated reads the plugin's checkpoint: the claim is prepared with
// want partitions, each created at the placement its device name gives,
// with a MIG UUID and the capability minors of its GI and CI; the
// plugin's log says it created each.
func (s *suite) checkCreated(t *testing.T, h holding, want int) []kubeletplugin.PreparedDevice {
	t.Helper()
	cp, err := kubeletplugin.NewCheckpointStore(s.realPluginDir).Load()
	if err != nil {
		t.Fatalf("plugin checkpoint: %v", err)
	}
	pc, ok := cp.Claims[h.claim.UID]
	if !ok || pc.State != kubeletplugin.PrepareCompleted {
		t.Fatalf("checkpoint: claim %s: %+v, want it prepared", h.claim.Name, pc)
	}
	log, err := os.ReadFile(s.plugins[0].Log)
	if err != nil {
		t.Fatal(err)
	}
	var devs []kubeletplugin.PreparedDevice
	for _, d := range pc.Devices {
		if d.MIG == nil || d.MIG.OnDemand == nil {
			continue
		}
		devs = append(devs, d)
		_, start, _ := strings.Cut(d.Device, "-at-")
		if strconv.Itoa(d.MIG.OnDemand.Placement.Start) != start {
			t.Errorf("checkpoint: %s created at memory slice %d", d.Device, d.MIG.OnDemand.Placement.Start)
		}
		if !strings.HasPrefix(d.UUID, "MIG-") || d.MIG.GICapMinor != 3+9*d.MIG.GI || d.MIG.CICapMinor != 4+9*d.MIG.GI+d.MIG.CI {
			t.Errorf("checkpoint: %s: uuid %q, GI %d CI %d, cap minors %d %d", d.Device, d.UUID, d.MIG.GI, d.MIG.CI, d.MIG.GICapMinor, d.MIG.CICapMinor)
		}
		if !strings.Contains(string(log), `"Created MIG instance"`) || !strings.Contains(string(log), `device="`+d.Device+`"`) {
			t.Errorf("plugin log %s: no \"Created MIG instance\" for %s", s.plugins[0].Log, d.Device)
		}
		t.Logf("%s: instance GI %d CI %d at memory slice %d, %s", d.Device, d.MIG.GI, d.MIG.CI, d.MIG.OnDemand.Placement.Start, d.UUID)
	}
	if len(devs) != want {
		t.Fatalf("checkpoint: claim %s has %d partitions, want %d: %+v", h.claim.Name, len(devs), want, pc.Devices)
	}
	return devs
}

// checkPartitionContainer checks that the container sees exactly the
// created instances: their UUIDs, GPU 0's node and their cap nodes, which
// the claim's CDI spec names.
func (s *suite) checkPartitionContainer(t *testing.T, h holding, devs []kubeletplugin.PreparedDevice) {
	t.Helper()
	var uuids []string
	wantDev := []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl", "/dev/nvidia-caps", "/dev/nvidia0"}
	spec := s.claimSpec(t, string(h.claim.UID))
	for _, d := range devs {
		uuids = append(uuids, d.UUID)
		for _, m := range []int{d.MIG.GICapMinor, d.MIG.CICapMinor} {
			node := "/dev/nvidia-caps/nvidia-cap" + strconv.Itoa(m)
			wantDev = append(wantDev, node)
			if !strings.Contains(spec, node) {
				t.Errorf("claim %s's CDI spec lacks %s", h.claim.Name, node)
			}
		}
	}
	visible, _ := env(h.log, "NVIDIA_VISIBLE_DEVICES")
	s.checkSeen(t, h, strings.Split(visible, ","), uuids, wantDev, "the created instances'")
}

// claimSpec returns the text of the CDI spec the plugin wrote for a claim.
func (s *suite) claimSpec(t *testing.T, uid string) string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(s.cluster.CDIDir(), driver.Name+"-claim_*"+uid+"*"))
	if err != nil || len(files) != 1 {
		t.Fatalf("CDI spec of claim UID %s in %s: %v, %v", uid, s.cluster.CDIDir(), files, err)
	}
	b, err := os.ReadFile(files[0])
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// waitEvent waits for an event in the test namespace whose message
// contains text.
func (s *suite) waitEvent(ctx context.Context, t *testing.T, text string) {
	t.Helper()
	var seen []string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, allocTimeout, true, func(ctx context.Context) (bool, error) {
		list, err := s.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		seen = seen[:0]
		for _, e := range list.Items {
			seen = append(seen, e.InvolvedObject.Name+": "+e.Message)
			if strings.Contains(e.Message, text) {
				t.Logf("event on %s %s: %s", e.InvolvedObject.Kind, e.InvolvedObject.Name, e.Message)
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Fatalf("no event saying %q: %v; events:\n%s", text, err, strings.Join(seen, "\n"))
	}
}

// waitDestroyed waits until the claim is gone from the plugin's checkpoint
// and from the API, its CDI spec is removed and the plugin logged
// destroying each of its partitions' instances.
func (s *suite) waitDestroyed(ctx context.Context, t *testing.T, claim string, devices []string) {
	t.Helper()
	var state string
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		if _, err := s.client.ResourceV1().ResourceClaims(ns).Get(ctx, claim, metav1.GetOptions{}); err == nil {
			state = "claim " + claim + " still exists"
			return false, nil
		}
		cp, err := kubeletplugin.NewCheckpointStore(s.realPluginDir).Load()
		if err != nil {
			return false, err
		}
		for _, pc := range cp.Claims {
			if pc.Name == claim {
				state = "claim " + claim + " still in the checkpoint"
				return false, nil
			}
		}
		files, _ := filepath.Glob(filepath.Join(s.cluster.CDIDir(), driver.Name+"-claim_*"))
		for _, f := range files {
			b, _ := os.ReadFile(f)
			for _, d := range devices {
				if strings.Contains(string(b), d) {
					state = "CDI spec " + f + " left"
					return false, nil
				}
			}
		}
		log, err := os.ReadFile(s.plugins[0].Log)
		if err != nil {
			return false, err
		}
		for _, d := range devices {
			if !strings.Contains(string(log), "\"Destroyed MIG instance\"") || !strings.Contains(string(log), `claim="`+ns+"/"+claim+`" device="`+d+`"`) {
				state = "no \"Destroyed MIG instance\" logged for " + d
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("after deleting claim %s's pod: %s: %v", claim, state, err)
	}
	t.Logf("claim %s: instances of %v destroyed, CDI spec removed", claim, devices)
}
