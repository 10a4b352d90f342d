package kubeletplugin

import (
	"strings"
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver"
)

// A prepare error reaches the tenant (the kubelet puts it into the pod's
// events): when a claim conflicts with another tenant's prepared claim, it
// says what is in the way on the GPU, but names neither the other claim's
// namespace, name nor UID. The plugin's own log has them.
func TestPrepareErrorsNameNoOtherTenant(t *testing.T) {
	inNS := func(c *resourceapi.ResourceClaim, ns, name string) *resourceapi.ResourceClaim {
		c.Namespace, c.Name = ns, name
		return c
	}
	hami := func(results ...resourceapi.DeviceRequestAllocationResult) *resourceapi.ResourceClaim {
		return newClaim("x", results, opaqueEntry(resourceapi.AllocationConfigSourceClass, driver.Name, nil, sharingConfig("HAMiCore")))
	}
	for _, tc := range []struct {
		name        string
		env         func(t *testing.T) *env
		first, then *resourceapi.ResourceClaim
		want        string
	}{
		{"Concurrent beside another namespace's Concurrent", func(t *testing.T) *env { return newEnv(t, loadTopology(t, "pcie-4.txt")) },
			concurrentClaim("victim-claim", "victim-ns", shareOf("s", 0, "2Gi", 20)), concurrentClaim("c", "tenant", shareOf("s", 0, "2Gi", 20)),
			"carries Concurrent MPS shares of another namespace"},
		{"Isolated beside another namespace's Concurrent", func(t *testing.T) *env { return newEnv(t, loadTopology(t, "pcie-4.txt")) },
			concurrentClaim("victim-claim", "victim-ns", shareOf("s", 0, "2Gi", 20)), inNS(newClaim("c", []resourceapi.DeviceRequestAllocationResult{shareOf("s", 0, "2Gi", 20)}), "tenant", "c"),
			"carries Concurrent MPS shares of another namespace"},
		{"Concurrent beside another claim's HAMi-core share", func(t *testing.T) *env { return newEnv(t, loadTopology(t, "pcie-4.txt")) },
			inNS(hami(shareOf("s", 0, "2Gi", 20)), "victim-ns", "victim-claim"), concurrentClaim("c", "tenant", shareOf("s", 0, "2Gi", 20)),
			"carries a share that is not a Concurrent MPS share (HAMiCore, of another claim)"},
		{"share of a GPU another claim has whole", func(t *testing.T) *env { return newEnv(t, loadTopology(t, "pcie-4.txt")) },
			inNS(newClaim("x", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0)}), "victim-ns", "victim-claim"), inNS(hami(shareOf("s", 0, "1Gi", 10)), "tenant", "c"),
			`"gpu-0" is already prepared whole for another claim`},
		{"MIG device another claim holds", migEnv,
			inNS(newClaim("x", []resourceapi.DeviceRequestAllocationResult{migResult("g", "gpu-0-mig-1-0")}), "victim-ns", "victim-claim"),
			inNS(newClaim("x", []resourceapi.DeviceRequestAllocationResult{migResult("g", "gpu-0-mig-1-0")}), "tenant", "c"),
			`MIG device "gpu-0-mig-1-0" is already prepared for another claim`},
		{"partition overlapping another claim's", func(t *testing.T) *env { return newOnDemandEnv(t, "dgxa100", nil).env },
			inNS(newClaim("x", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-3g-20gb-at-4")}), "victim-ns", "victim-claim"),
			inNS(newClaim("x", []resourceapi.DeviceRequestAllocationResult{partResult("mig", "gpu-0-part-1g-5gb-at-5")}), "tenant", "c"),
			"(gpu-0-part-3g-20gb-at-4 of another claim)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := tc.env(t)
			d := e.start()
			mustPrepare(t, d, tc.first)
			buf := ktesting.NewLogger(t, ktesting.NewConfig(ktesting.BufferLogs(true)))
			ctx := klog.NewContext(t.Context(), buf)
			res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{tc.then})
			if err != nil {
				t.Fatal(err)
			}
			got := res[tc.then.UID].Err
			if got == nil {
				t.Fatal("prepared beside the other tenant's claim")
			}
			if !strings.Contains(got.Error(), tc.want) {
				t.Errorf("error %q, want it to contain %q", got, tc.want)
			}
			for _, secret := range []string{tc.first.Namespace, tc.first.Name, string(tc.first.UID)} {
				if strings.Contains(got.Error(), secret) {
					t.Errorf("the tenant's error %q names %q of the other tenant's claim", got, secret)
				}
			}
			log := buf.GetSink().(ktesting.Underlier).GetBuffer().String()
			if !strings.Contains(log, string(tc.first.UID)) || !strings.Contains(log, tc.first.Namespace+"/"+tc.first.Name) {
				t.Errorf("the plugin's log does not name the conflicting claim %s/%s (%s):\n%s", tc.first.Namespace, tc.first.Name, tc.first.UID, log)
			}
		})
	}
}
