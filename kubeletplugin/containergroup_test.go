package kubeletplugin

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpulink/gpulink/driver"
)

func withGroup(c *resourceapi.ResourceClaim, group string) *resourceapi.ResourceClaim {
	c.Annotations = map[string]string{driver.ContainerClaimsAnnotation: group}
	return c
}

// NVIDIA's bats gpu-two-claims-one-pod: one container, two claims. With
// the controller's group annotation both claims' specs number the two
// GPUs as one set, so the container sees both in NVIDIA_VISIBLE_DEVICES
// and GPULINK_DEVICE_0/1 whichever claim the kubelet applies last.
// Without it (or with one that does not hold) each claim describes itself.
func TestContainerGroupNumbersGPUsAsOneSet(t *testing.T) {
	uuid := func(i int) string { return fmt.Sprintf("GPU-%08d-0000-0000-0000-000000000000", i) }
	for name, tc := range map[string]struct {
		groupA, groupB string
		wantVisible    string
		wantDevices    map[string]string
		wantPeers      int
	}{
		"grouped": {groupA: "a,b", groupB: "a,b", wantVisible: uuid(1) + "," + uuid(3), wantPeers: 1,
			wantDevices: map[string]string{"GPULINK_DEVICE_0": "gpu-1", "GPULINK_DEVICE_1": "gpu-3"}},
		"no annotation": {wantVisible: uuid(1),
			wantDevices: map[string]string{"GPULINK_DEVICE_0": "gpu-1"}},
		"only one claim annotated": {groupA: "a,b", wantVisible: uuid(1),
			wantDevices: map[string]string{"GPULINK_DEVICE_0": "gpu-1"}},
		"names a claim not prepared with it": {groupA: "a,b,c", groupB: "a,b,c", wantVisible: uuid(1),
			wantDevices: map[string]string{"GPULINK_DEVICE_0": "gpu-1"}},
	} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, loadTopology(t, "pcie-4.txt"))
			d := e.start()
			// b is applied last by the kubelet here; with the group, a's
			// GPU keeps ordinal 0 anyway (PCI order).
			a := newClaim("a", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpu", 3)})
			b := newClaim("b", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpu", 1)})
			if tc.groupA != "" {
				withGroup(a, tc.groupA)
			}
			if tc.groupB != "" {
				withGroup(b, tc.groupB)
			}
			res := prepare(t, d, a, b)
			for _, c := range []*resourceapi.ResourceClaim{a, b} {
				if res[c.UID].Err != nil {
					t.Fatalf("prepare %s: %v", c.Name, res[c.UID].Err)
				}
			}
			devs := append(slices.Clone(res[a.UID].Devices), res[b.UID].Devices...)
			spec := injectDevices(t, e, devs)
			if got, want := deviceNodes(spec), []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia1", "/dev/nvidia3", "/dev/nvidiactl"}; !slices.Equal(got, want) {
				t.Errorf("device nodes %v, want %v", got, want)
			}
			env := envMap(spec)
			if env["NVIDIA_VISIBLE_DEVICES"] != tc.wantVisible {
				t.Errorf("NVIDIA_VISIBLE_DEVICES=%q, want %q", env["NVIDIA_VISIBLE_DEVICES"], tc.wantVisible)
			}
			for k, want := range tc.wantDevices {
				if env[k] != want {
					t.Errorf("%s=%q, want %q", k, env[k], want)
				}
			}
			// The checkpoint keeps the peers, so that a spec rebuilt after a
			// restart numbers the GPUs the same way.
			if n := len(readCheckpoint(t, e).Claims[a.UID].ContainerPeers); n != tc.wantPeers {
				t.Errorf("checkpoint has %d peers of claim a, want %d", n, tc.wantPeers)
			}
		})
	}
}

// The same claims in separate containers (no group): each sees its own.
func TestContainerGroupEachClaimAlone(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	a := newClaim("a", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpu", 0), wholeGPU("gpu", 2)})
	b := newClaim("b", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpu", 1)})
	res := prepare(t, d, a, b)
	for c, devs := range map[*resourceapi.ResourceClaim][]draplugin.Device{a: res[a.UID].Devices, b: res[b.UID].Devices} {
		env := envMap(injectDevices(t, e, devs))
		n := 0
		for k := range env {
			if strings.HasPrefix(k, "GPULINK_DEVICE_") {
				n++
			}
		}
		if want := len(c.Status.Allocation.Devices.Results); n != want {
			t.Errorf("claim %s: %d GPULINK_DEVICE_* variables, want %d: %v", c.Name, n, want, env)
		}
	}
}
