package kubeletplugin

import (
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
	"github.com/prometheus/client_golang/prometheus"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
)

// startWithRegistry starts a Driver on e whose metrics are registered in a
// registry of their own with the node label, as the binary does.
func startWithRegistry(t *testing.T, e *env) (*Driver, *prometheus.Registry) {
	t.Helper()
	return startWithNodeMetrics(t, e, NodeMetricsOptions{Node: e.opts.NodeName, PodMetrics: true})
}

// startWithNodeMetrics is startWithRegistry with the given options.
func startWithNodeMetrics(t *testing.T, e *env, o NodeMetricsOptions) (*Driver, *prometheus.Registry) {
	t.Helper()
	cdi, err := NewCDIDir(e.cdiDir)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	d, err := New(e.ctx, e.opts, Dependencies{
		Discoverer: e.disc,
		CDI:        cdi,
		MPS:        mps.NewManager(e.mpsRoot, e.daemon),
		BootID:     func() (string, error) { return e.bootID, nil },
		Metrics:    NewNodeMetrics(reg, o),
	})
	if err != nil {
		t.Fatal(err)
	}
	return d, reg
}

// infoSeries gathers reg and returns the PreparedGPUInfoName series as
// sorted "label=value,..." strings (labels in PreparedGPUInfoLabels
// order), failing when a series has other labels or a value other than 1.
func infoSeries(t *testing.T, reg *prometheus.Registry) []string {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, f := range families {
		if f.GetName() != PreparedGPUInfoName {
			continue
		}
		for _, m := range f.GetMetric() {
			if v := m.GetGauge().GetValue(); v != 1 {
				t.Errorf("series %v has value %v, want 1", m.GetLabel(), v)
			}
			got := map[string]string{}
			var names []string
			for _, l := range m.GetLabel() {
				got[l.GetName()] = l.GetValue()
				names = append(names, l.GetName())
			}
			want := slices.Clone(PreparedGPUInfoLabels)
			sort.Strings(want)
			sort.Strings(names)
			if !slices.Equal(names, want) {
				t.Errorf("series has labels %v, want %v", names, want)
			}
			parts := make([]string, 0, len(PreparedGPUInfoLabels))
			for _, n := range PreparedGPUInfoLabels {
				parts = append(parts, n+"="+got[n])
			}
			out = append(out, strings.Join(parts, ","))
		}
	}
	sort.Strings(out)
	return out
}

func reservedFor(c *resourceapi.ResourceClaim, pods ...string) *resourceapi.ResourceClaim {
	c.Status.ReservedFor = nil
	for _, p := range pods {
		c.Status.ReservedFor = append(c.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{
			Resource: "pods", Name: p, UID: types.UID("uid-" + p),
		})
	}
	return c
}

func TestPreparedGPUInfoSeries(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d, reg := startWithRegistry(t, e)
	if got := infoSeries(t, reg); len(got) != 0 {
		t.Fatalf("series before any prepare: %v", got)
	}

	whole := reservedFor(newClaim("train", nil), "trainer-0")
	whole.Status.Allocation.Devices.Results = append(whole.Status.Allocation.Devices.Results, wholeGPU("gpus", 0), wholeGPU("gpus", 2))
	// Two MPS shares of gpu-1 in one claim, used by two pods, and a
	// consumer that is not a pod (left out).
	shared := reservedFor(newClaim("infer", []resourceapi.DeviceRequestAllocationResult{
		shareOf("a", 1, "2Gi", 20), shareOf("b", 1, "1Gi", 10),
	}), "web-0", "web-1")
	shared.Status.ReservedFor = append(shared.Status.ReservedFor, resourceapi.ResourceClaimConsumerReference{
		APIGroup: "example.com", Resource: "jobs", Name: "not-a-pod",
	})
	mustPrepare(t, d, whole)
	mustPrepare(t, d, shared)

	uuid := func(i int) string { return d.topo.GPUs[i].UUID }
	wholeSeries := []string{
		"node=node-a,gpu=gpu-0,UUID=" + uuid(0) + ",namespace=default,pod=trainer-0,claim=train,kind=whole,strategy=,share_memory_bytes=,share_cores=",
		"node=node-a,gpu=gpu-2,UUID=" + uuid(2) + ",namespace=default,pod=trainer-0,claim=train,kind=whole,strategy=,share_memory_bytes=,share_cores=",
	}
	sharedSeries := func(pods ...string) []string {
		var out []string
		for _, p := range pods {
			out = append(out, "node=node-a,gpu=gpu-1,UUID="+uuid(1)+",namespace=default,pod="+p+",claim=infer,kind=share,strategy=MPS,share_memory_bytes=3221225472,share_cores=30")
		}
		return out
	}
	want := append(slices.Clone(wholeSeries), sharedSeries("web-0", "web-1")...)
	sort.Strings(want)
	if got := infoSeries(t, reg); !slices.Equal(got, want) {
		t.Fatalf("after prepare:\ngot  %q\nwant %q", got, want)
	}

	// The kubelet asks again with another reservedFor: the series follow.
	mustPrepare(t, d, reservedFor(shared, "web-1", "web-2"))
	want = append(slices.Clone(wholeSeries), sharedSeries("web-1", "web-2")...)
	sort.Strings(want)
	if got := infoSeries(t, reg); !slices.Equal(got, want) {
		t.Fatalf("after a second prepare with other pods:\ngot  %q\nwant %q", got, want)
	}

	mustUnprepare(t, d, whole)
	want = sharedSeries("web-1", "web-2")
	if got := infoSeries(t, reg); !slices.Equal(got, want) {
		t.Fatalf("after unprepare:\ngot  %q\nwant %q", got, want)
	}

	// A restarted plugin rebuilds the series from the checkpoint.
	d2, reg2 := startWithRegistry(t, e)
	if got := infoSeries(t, reg2); !slices.Equal(got, want) {
		t.Fatalf("after restart:\ngot  %q\nwant %q", got, want)
	}
	mustUnprepare(t, d2, shared)
	if got := infoSeries(t, reg2); len(got) != 0 {
		t.Fatalf("after the last unprepare: %q", got)
	}
}

func TestPreparedGPUInfoClaimWithoutPods(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d, reg := startWithRegistry(t, e)
	c := newClaim("lonely", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 3)})
	mustPrepare(t, d, c)
	got := infoSeries(t, reg)
	if len(got) != 1 || !strings.Contains(got[0], ",pod=,claim=lonely,kind=whole,") {
		t.Fatalf("got %q, want one series of claim lonely with an empty pod", got)
	}
}

// Without PodMetrics (the default) the plugin exports no series naming a
// tenant's namespace, pod or claim: its metrics port has no
// authentication. Its other series stay.
func TestPodMetricsOffByDefault(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d, reg := startWithNodeMetrics(t, e, NodeMetricsOptions{Node: e.opts.NodeName})
	claim := newClaim("secret-claim", []resourceapi.DeviceRequestAllocationResult{wholeGPU("gpus", 0)})
	claim.Namespace = "secret-tenant"
	mustPrepare(t, d, reservedFor(claim, "secret-pod"))
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, f := range families {
		names = append(names, f.GetName())
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if v := l.GetValue(); strings.Contains(v, "secret") {
					t.Errorf("%s exports %s=%q", f.GetName(), l.GetName(), v)
				}
			}
		}
	}
	if slices.Contains(names, PreparedGPUInfoName) || !slices.Contains(names, "gpulink_kubeletplugin_prepared_claims") {
		t.Errorf("families %v: want gpulink_kubeletplugin_prepared_claims and no %s", names, PreparedGPUInfoName)
	}
}
