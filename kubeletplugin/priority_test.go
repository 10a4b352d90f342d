package kubeletplugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
)

func priorityConfig(raw string) string {
	return `{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{` + raw + `}}`
}

// The claim's sharing.priority reaches its containers in the variable of
// the strategy that enforces it, and only there.
func TestCDIPriorityEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		results []resourceapi.DeviceRequestAllocationResult
		configs []resourceapi.DeviceAllocationConfiguration
		want    map[string]string
		absent  []string
	}{
		{
			name:    "MPS share, low priority from the claim",
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "5Gi", 30)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil, priorityConfig(`"priority":1`))},
			want:    map[string]string{envMPSClientPriority: "1", envSharePriority: "1", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "30"},
			absent:  []string{envHAMiTaskPriority},
		},
		{
			// 0 is a priority (HAMi's high, MPS's normal), not "unset".
			name:    "MPS shares on two GPUs, high priority from the class",
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "5Gi", 30), shareOf("s", 2, "5Gi", 30)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, priorityConfig(`"priority":0`))},
			want:    map[string]string{envMPSClientPriority: "0", envSharePriority: "0"},
			absent:  []string{envHAMiTaskPriority},
		},
		{
			name:    "HAMi-core share",
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 2, "3Gi", 40)},
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("HAMiCore")),
				opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil, priorityConfig(`"priority":1`)),
			},
			want:   map[string]string{envHAMiTaskPriority: "1", envSharePriority: "1", "CUDA_DEVICE_SM_LIMIT_0": "40"},
			absent: []string{envMPSClientPriority},
		},
		{
			name:    "no priority: the mechanism's default",
			results: []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "5Gi", 30)},
			absent:  []string{envMPSClientPriority, envHAMiTaskPriority, envSharePriority},
		},
		{
			// A GPU no one else uses needs no order.
			name:    "whole GPU",
			results: []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 3)},
			configs: []resourceapi.DeviceAllocationConfiguration{opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil, priorityConfig(`"priority":1`))},
			absent:  []string{envMPSClientPriority, envHAMiTaskPriority, envSharePriority},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, loadTopology(t, "pcie-4.txt"))
			d := e.start()
			c := newClaim("p", tc.results, tc.configs...)
			env := envMap(injected(t, e, d, c))
			for k, v := range tc.want {
				if got, ok := env[k]; !ok || got != v {
					t.Errorf("%s=%q (set %t), want %q", k, got, ok, v)
				}
			}
			for _, k := range tc.absent {
				if v, ok := env[k]; ok {
					t.Errorf("%s=%q set, want it absent", k, v)
				}
			}
			// The priority survives a restart: the spec rewritten from
			// the checkpoint carries it too.
			cp := readCheckpoint(t, e).Claims[c.UID]
			if prio, _ := claimPriority(cp); (prio != nil) != (tc.want[envSharePriority] != "") {
				t.Errorf("checkpointed priority %v, want %q", prio, tc.want[envSharePriority])
			}
		})
	}
}

// Two requests of one claim asking different priorities are refused at
// prepare, naming both results and values: a container gets one value.
func TestPrepareRefusesMixedPriorities(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	for _, tc := range []struct {
		name    string
		configs []resourceapi.DeviceAllocationConfiguration
		want    []string
	}{
		{
			name: "0 and 1",
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, []string{"a"}, priorityConfig(`"priority":0`)),
				opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, []string{"b"}, priorityConfig(`"priority":1`)),
			},
			want: []string{"status.allocation.devices.results[1]: sharing.priority 1", "results[0] asks 0"},
		},
		{
			name: "1 and unset",
			configs: []resourceapi.DeviceAllocationConfiguration{
				opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, []string{"a"}, priorityConfig(`"priority":1`)),
			},
			want: []string{"sharing.priority unset", "asks 1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := newClaim("mixed", []resourceapi.DeviceRequestAllocationResult{shareOf("a", 1, "1Gi", 20), shareOf("b", 2, "1Gi", 20)}, tc.configs...)
			r := prepare(t, d, c)[c.UID]
			if r.Err == nil {
				t.Fatalf("prepared %+v, want an error", r.Devices)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.Err.Error(), w) {
					t.Errorf("error %q does not mention %q", r.Err, w)
				}
			}
			if e.specExists(c.UID) {
				t.Error("a CDI spec was written for the refused claim")
			}
		})
	}
}

// A priority the kubelet plugin is handed by someone else than the
// controller is still validated (strict decode, 0 or 1).
func TestPrepareRefusesBadPriority(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	c := newClaim("bad", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 1, "1Gi", 20)},
		opaqueEntry(resourceapi.AllocationConfigSourceClaim, driver.Name, nil, priorityConfig(`"priority":2`)))
	r := prepare(t, d, c)[c.UID]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "sharing.priority: Invalid value: 2") {
		t.Fatalf("error %v, want one naming sharing.priority and 2", r.Err)
	}
}
