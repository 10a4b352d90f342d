package kubeletplugin

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/health"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// healthEnv is a Driver with health handling on, its recorder and metrics.
type healthEnv struct {
	*env
	rec     *events.FakeRecorder
	metrics *Metrics
}

func newHealthEnv(t *testing.T, opts HealthOptions) *healthEnv {
	t.Helper()
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	e.opts.Health = &opts
	return &healthEnv{env: e, rec: events.NewFakeRecorder(100), metrics: NewMetrics(nil)}
}

func (h *healthEnv) start(t *testing.T) *Driver {
	t.Helper()
	cdi, err := NewCDIDir(h.cdiDir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(h.ctx, h.opts, Dependencies{
		Discoverer: h.disc, CDI: cdi, MPS: mps.NewManager(h.mpsRoot, h.daemon),
		BootID: func() (string, error) { return h.bootID, nil },
		Events: h.rec, Metrics: h.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// nextEvent returns the next recorded Kubernetes event, "" if none.
func (h *healthEnv) nextEvent() string {
	select {
	case e := <-h.rec.Events:
		return e
	default:
		return ""
	}
}

// taintsOf returns the taints of device in res.
func taintsOf(t *testing.T, res resourceslice.DriverResources, device string) []resourceapi.DeviceTaint {
	t.Helper()
	for _, s := range res.Pools[testNode].Slices {
		for _, d := range s.Devices {
			if d.Name == device {
				return d.Taints
			}
		}
	}
	t.Fatalf("device %s not published", device)
	return nil
}

func unhealthyTaint(taints []resourceapi.DeviceTaint) *resourceapi.DeviceTaint {
	for i := range taints {
		if taints[i].Key == driver.UnhealthyTaintKey {
			return &taints[i]
		}
	}
	return nil
}

func TestHealthEventTaintsAndRecovers(t *testing.T) {
	for _, effect := range []resourceapi.DeviceTaintEffect{"", resourceapi.DeviceTaintEffectNoExecute} {
		t.Run("effect "+string(effect), func(t *testing.T) {
			h := newHealthEnv(t, HealthOptions{Policy: health.DefaultPolicy(), TaintEffect: effect})
			d := h.start(t)
			wantEffect := effect
			if wantEffect == "" {
				wantEffect = resourceapi.DeviceTaintEffectNoSchedule
			}
			ctx, cancel := context.WithCancel(h.ctx)
			defer cancel()
			pub := &fakePublisher{notify: make(chan struct{}, 10)}
			done := make(chan error, 1)
			go func() { done <- d.RunPublisher(ctx, pub) }()
			waitPublished := func(what string) resourceslice.DriverResources {
				t.Helper()
				select {
				case <-pub.notify:
				case <-time.After(10 * time.Second):
					t.Fatalf("no publication %s", what)
				}
				return pub.last()
			}
			first := waitPublished("at start")
			if taint := unhealthyTaint(taintsOf(t, first, "gpu-1")); taint != nil {
				t.Fatalf("healthy GPU published with taint %+v", taint)
			}
			if got := testutil.ToFloat64(h.metrics.DeviceHealthy.WithLabelValues("gpu-1", "GPU-00000001-0000-0000-0000-000000000000")); got != 1 {
				t.Errorf("device_healthy of gpu-1 at start = %v, want 1", got)
			}

			// An application XID changes nothing.
			d.HandleHealthEvent(h.ctx, health.Event{Device: "gpu-1", Kind: health.KindXID, XID: 13})
			if e := h.nextEvent(); e != "" {
				t.Errorf("application XID recorded event %q", e)
			}
			if got := testutil.ToFloat64(h.metrics.HealthEvents.WithLabelValues("gpu-1", "ignored")); got != 1 {
				t.Errorf("ignored events of gpu-1 = %v, want 1", got)
			}

			// A fatal XID, reported by UUID, taints gpu-1 and republishes.
			d.HandleHealthEvent(h.ctx, health.Event{UUID: "GPU-00000001-0000-0000-0000-000000000000", Kind: health.KindXID, XID: 79, Message: "fell off the bus"})
			res := waitPublished("after the fatal XID")
			taints := taintsOf(t, res, "gpu-1")
			taint := unhealthyTaint(taints)
			if taint == nil || taint.Value != "xid-79" || taint.Effect != wantEffect || taint.TimeAdded == nil {
				t.Fatalf("gpu-1 taints %+v, want %s=xid-79:%s with a time", taints, driver.UnhealthyTaintKey, wantEffect)
			}
			if len(taints) != 2 || taints[0].Key != driver.ManagedTaintKey {
				t.Errorf("gpu-1 taints %+v, want the managed taint kept first", taints)
			}
			if other := unhealthyTaint(taintsOf(t, res, "gpu-0")); other != nil {
				t.Errorf("gpu-0 tainted too: %+v", other)
			}
			ev := h.nextEvent()
			if !strings.HasPrefix(ev, "Warning GPUUnhealthy GPU gpu-1 (GPU-00000001") || !strings.Contains(ev, "xid-79") || !strings.Contains(ev, string(wantEffect)) {
				t.Errorf("event %q, want a GPUUnhealthy warning naming gpu-1, xid-79 and the effect", ev)
			}
			if got := testutil.ToFloat64(h.metrics.DeviceHealthy.WithLabelValues("gpu-1", "GPU-00000001-0000-0000-0000-000000000000")); got != 0 {
				t.Errorf("device_healthy of gpu-1 = %v, want 0", got)
			}
			if got := testutil.ToFloat64(h.metrics.HealthEvents.WithLabelValues("gpu-1", "fatal")); got != 1 {
				t.Errorf("fatal events of gpu-1 = %v, want 1", got)
			}

			// The same XID again: no new publication, no new event.
			d.HandleHealthEvent(h.ctx, health.Event{Device: "gpu-1", Kind: health.KindXID, XID: 79})
			if e := h.nextEvent(); e != "" {
				t.Errorf("repeated XID recorded event %q", e)
			}

			// A warning is recorded but taints nothing.
			d.HandleHealthEvent(h.ctx, health.Event{Device: "gpu-2", Kind: health.KindThermal, Message: "hot"})
			if ev := h.nextEvent(); !strings.HasPrefix(ev, "Warning GPUWarning GPU gpu-2") {
				t.Errorf("thermal event %q, want a GPUWarning on gpu-2", ev)
			}
			if taint := unhealthyTaint(d.Resources().Pools[testNode].Slices[0].Devices[2].Taints); taint != nil {
				t.Errorf("thermal warning tainted gpu-2: %+v", taint)
			}

			// The operator's clear removes the taint.
			d.HandleHealthEvent(h.ctx, health.Event{Device: "gpu-1", Kind: health.KindRecovered, Message: "reset by operator"})
			res = waitPublished("after the recovery")
			if taint := unhealthyTaint(taintsOf(t, res, "gpu-1")); taint != nil {
				t.Fatalf("recovered gpu-1 still tainted: %+v", taint)
			}
			if ev := h.nextEvent(); !strings.HasPrefix(ev, "Normal GPURecovered GPU gpu-1") {
				t.Errorf("recovery event %q, want Normal GPURecovered", ev)
			}
			if got := testutil.ToFloat64(h.metrics.DeviceHealthy.WithLabelValues("gpu-1", "GPU-00000001-0000-0000-0000-000000000000")); got != 1 {
				t.Errorf("device_healthy of recovered gpu-1 = %v, want 1", got)
			}

			// A GPU the node does not have is refused.
			d.HandleHealthEvent(h.ctx, health.Event{Device: "gpu-9", Kind: health.KindGPULost})
			if e := h.nextEvent(); e != "" {
				t.Errorf("event for an unknown GPU recorded %q", e)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		})
	}
}

func TestHealthSurvivesRestartNotReboot(t *testing.T) {
	h := newHealthEnv(t, HealthOptions{Policy: health.DefaultPolicy()})
	d := h.start(t)
	d.HandleHealthEvent(h.ctx, health.Event{Device: "gpu-3", Kind: health.KindECCDoubleBit})
	restarted := h.start(t)
	taint := unhealthyTaint(taintsOf(t, restarted.Resources(), "gpu-3"))
	if taint == nil || taint.Value != "ecc-dbe" {
		t.Fatalf("after a restart gpu-3 taint = %+v, want ecc-dbe", taint)
	}
	if got := testutil.ToFloat64(h.metrics.DeviceHealthy.WithLabelValues("gpu-3", "GPU-00000003-0000-0000-0000-000000000000")); got != 0 {
		t.Errorf("device_healthy after restart = %v, want 0", got)
	}
	h.bootID = "boot-2"
	rebooted := h.start(t)
	if taint := unhealthyTaint(taintsOf(t, rebooted.Resources(), "gpu-3")); taint != nil {
		t.Fatalf("after a reboot gpu-3 still tainted: %+v", taint)
	}
}

func TestHealthOptionsValidated(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts HealthOptions
		want string
	}{
		{"effect", HealthOptions{TaintEffect: "PreferNoSchedule"}, `"PreferNoSchedule"`},
		{"overlapping lists", HealthOptions{Policy: health.Policy{FatalXIDs: []uint64{79}, IgnoredXIDs: []uint64{79}}}, "XID 79"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHealthEnv(t, tc.opts)
			_, err := h.newDriver()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error containing %s", err, tc.want)
			}
		})
	}
}

func receiveReport(t *testing.T, ch <-chan draplugin.DeviceHealthReport) map[string]draplugin.DeviceHealth {
	t.Helper()
	select {
	case r := <-ch:
		out := map[string]draplugin.DeviceHealth{}
		for _, d := range r.Devices {
			if d.PoolName != testNode {
				t.Errorf("device %s in pool %q, want %q", d.DeviceName, d.PoolName, testNode)
			}
			out[d.DeviceName] = d
		}
		return out
	case <-time.After(10 * time.Second):
		t.Fatal("no health report")
		return nil
	}
}

func TestWatchHealthStatus(t *testing.T) {
	h := newHealthEnv(t, HealthOptions{Policy: health.DefaultPolicy(), ResendInterval: time.Hour})
	d := h.start(t)
	ctx, cancel := context.WithCancel(h.ctx)
	ch := make(chan draplugin.DeviceHealthReport)
	done := make(chan error, 1)
	go func() { done <- d.WatchHealthStatus(ctx, ch) }()

	r := receiveReport(t, ch)
	if len(r) != 4 {
		t.Fatalf("first report covers %d GPUs, want 4", len(r))
	}
	for name, dh := range r {
		if dh.Health != draplugin.HealthStatusHealthy || dh.HealthCheckTimeout != 3*time.Hour {
			t.Errorf("%s: %+v, want healthy with a 3h timeout", name, dh)
		}
	}
	d.HandleHealthEvent(h.ctx, health.Event{Device: "gpu-2", Kind: health.KindGPULost})
	r = receiveReport(t, ch)
	if dh := r["gpu-2"]; dh.Health != draplugin.HealthStatusUnhealthy || dh.Message != "gpu-lost" {
		t.Errorf("gpu-2 after GPU lost: %+v", dh)
	}
	if dh := r["gpu-0"]; dh.Health != draplugin.HealthStatusHealthy {
		t.Errorf("gpu-0: %+v", dh)
	}
	if err := d.HealthError(); err != nil {
		t.Errorf("HealthError with working sources = %v", err)
	}

	// A source that cannot read the GPUs: unknown, not healthy, and the
	// liveness check fails.
	sink := healthSink{d: d, ctx: h.ctx, source: "nvml"}
	sink.SourceFailing(errors.New("NVML: driver not loaded"))
	r = receiveReport(t, ch)
	if dh := r["gpu-0"]; dh.Health != draplugin.HealthStatusUnknown {
		t.Errorf("gpu-0 with NVML failing: %+v, want unknown", dh)
	}
	if dh := r["gpu-2"]; dh.Health != draplugin.HealthStatusUnhealthy {
		t.Errorf("gpu-2 with NVML failing: %+v, want still unhealthy", dh)
	}
	if err := d.HealthError(); err == nil || !strings.Contains(err.Error(), "driver not loaded") {
		t.Errorf("HealthError = %v, want the source's error", err)
	}
	sink.SourceFailing(nil)
	r = receiveReport(t, ch)
	if dh := r["gpu-0"]; dh.Health != draplugin.HealthStatusHealthy {
		t.Errorf("gpu-0 after NVML works again: %+v", dh)
	}
	if err := d.HealthError(); err != nil {
		t.Errorf("HealthError after recovery = %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("WatchHealthStatus = %v, want nil at cancel", err)
	}
}

func TestWatchHealthStatusResends(t *testing.T) {
	h := newHealthEnv(t, HealthOptions{Policy: health.DefaultPolicy(), ResendInterval: 10 * time.Millisecond})
	d := h.start(t)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	ch := make(chan draplugin.DeviceHealthReport)
	go func() { _ = d.WatchHealthStatus(ctx, ch) }()
	// Nothing changes, reports keep coming.
	for range 3 {
		if r := receiveReport(t, ch); len(r) != 4 {
			t.Fatalf("report covers %d GPUs, want 4", len(r))
		}
	}
}

func TestWatchHealthStatusOff(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	if err := d.WatchHealthStatus(e.ctx, make(chan draplugin.DeviceHealthReport)); !errors.Is(err, draplugin.ErrHealthNotSupported) {
		t.Fatalf("WatchHealthStatus without health options = %v, want ErrHealthNotSupported", err)
	}
	if err := d.HealthError(); err != nil {
		t.Fatalf("HealthError without health options = %v", err)
	}
}

func TestRunHealthSourcesFailureFailsLiveness(t *testing.T) {
	h := newHealthEnv(t, HealthOptions{Policy: health.DefaultPolicy()})
	d := h.start(t)
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	d.runHealthSources(ctx, []HealthSource{failingSource{}})
	deadline := time.Now().Add(10 * time.Second)
	for d.HealthError() == nil {
		if time.Now().After(deadline) {
			t.Fatal("a source that returned an error does not fail the health check")
		}
		time.Sleep(time.Millisecond)
	}
	if err := d.HealthError(); !strings.Contains(err.Error(), "health source broken: cannot initialise") {
		t.Errorf("HealthError = %v", err)
	}
}

type failingSource struct{}

func (failingSource) Name() string { return "broken" }

func (failingSource) Run(context.Context, HealthSink) error {
	return errors.New("cannot initialise")
}

// TestHealthEventsOnePerGPU records through client-go's real event
// broadcaster, which folds events with the same regarding object, reason
// and action into one series: GPUs failing together must still each get
// an event of their own on the Node.
func TestHealthEventsOnePerGPU(t *testing.T) {
	h := newHealthEnv(t, HealthOptions{Policy: health.DefaultPolicy()})
	client := fake.NewClientset()
	broadcaster := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	ctx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	if err := broadcaster.StartRecordingToSinkWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	defer broadcaster.Shutdown()
	cdi, err := NewCDIDir(h.cdiDir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(h.ctx, h.opts, Dependencies{
		Discoverer: h.disc, CDI: cdi, MPS: mps.NewManager(h.mpsRoot, h.daemon),
		BootID: func() (string, error) { return h.bootID, nil },
		Events: broadcaster.NewRecorder(scheme.Scheme, "gpulink-kubeletplugin"), Metrics: h.metrics,
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, dev := range []string{"gpu-0", "gpu-1", "gpu-2"} {
		d.HandleHealthEvent(h.ctx, health.Event{Device: dev, Kind: health.KindGPULost})
	}
	want := map[string]bool{"GPU gpu-0 ": true, "GPU gpu-1 ": true, "GPU gpu-2 ": true}
	var notes []string
	err = wait.PollUntilContextTimeout(ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		list, err := client.EventsV1().Events("").List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err
		}
		notes = notes[:0]
		for _, e := range list.Items {
			if e.Reason == ReasonGPUUnhealthy && e.Regarding.Kind == "Node" && e.Regarding.Name == testNode {
				notes = append(notes, e.Note)
			}
		}
		return len(notes) >= len(want), nil
	})
	if err != nil {
		t.Fatalf("GPUUnhealthy events on node %s: %q; want one per GPU (%v)", testNode, notes, err)
	}
	for _, n := range notes {
		for prefix := range want {
			if strings.HasPrefix(n, prefix) {
				delete(want, prefix)
			}
		}
	}
	if len(want) != 0 {
		t.Errorf("no event for %v among %q", want, notes)
	}
}
