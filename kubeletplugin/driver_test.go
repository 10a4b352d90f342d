package kubeletplugin

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	resourceapi "k8s.io/api/resource/v1"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

type fakePublisher struct {
	mu        sync.Mutex
	published []resourceslice.DriverResources
	notify    chan struct{}
}

func (p *fakePublisher) PublishResources(_ context.Context, r resourceslice.DriverResources) error {
	p.mu.Lock()
	p.published = append(p.published, *r.DeepCopy())
	p.mu.Unlock()
	p.notify <- struct{}{}
	return nil
}

func (p *fakePublisher) last() resourceslice.DriverResources {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.published[len(p.published)-1]
}

func TestRunPublisherRediscovers(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	fc := clocktesting.NewFakeClock(time.Now())
	e.opts.RediscoverInterval = time.Minute
	cdi, err := NewCDIDir(e.cdiDir)
	if err != nil {
		t.Fatal(err)
	}
	d, err := New(e.ctx, e.opts, Dependencies{
		Discoverer: e.disc, CDI: cdi, MPS: mps.NewManager(e.mpsRoot, e.daemon),
		BootID: func() (string, error) { return "b", nil }, Clock: fc,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(e.ctx)
	pub := &fakePublisher{notify: make(chan struct{}, 10)}
	done := make(chan error)
	go func() { done <- d.RunPublisher(ctx, pub) }()
	<-pub.notify
	if n := len(pub.last().Pools[testNode].Slices[0].Devices); n != 4 {
		t.Fatalf("first publication has %d devices, want 4", n)
	}
	// Each tick must be consumed before the next, or the fake ticker
	// coalesces them: wait for the discovery call each one causes.
	tick := func() {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for !fc.HasWaiters() {
			if time.Now().After(deadline) {
				t.Fatal("publisher never waits on the ticker")
			}
			time.Sleep(time.Millisecond)
		}
		before := e.disc.callCount()
		fc.Step(time.Minute)
		for e.disc.callCount() == before {
			if time.Now().After(deadline) {
				t.Fatal("no rediscovery after a tick")
			}
			time.Sleep(time.Millisecond)
		}
	}

	// Unchanged discovery: no republication.
	tick()
	// A failing discovery keeps the old slices.
	e.disc.set(nil, errors.New("NVML gone"))
	tick()
	// A changed node is republished.
	smaller := loadTopology(t, "pcie-4.txt")
	smaller.GPUs[3].MemoryBytes = 8 * gib
	e.disc.set(smaller, nil)
	tick()
	select {
	case <-pub.notify:
	case <-time.After(10 * time.Second):
		t.Fatal("no republication after the GPUs changed")
	}
	got := pub.last().Pools[testNode].Slices[0].Devices[3].Capacity[driver.CapacityMemory].Value
	if got.Value() != 8*gib {
		t.Errorf("republished memory %s, want 8Gi", got.String())
	}
	pub.mu.Lock()
	n := len(pub.published)
	pub.mu.Unlock()
	if n != 2 {
		t.Errorf("%d publications, want 2 (initial and after the change)", n)
	}
	if testutil.ToFloat64(d.metrics.BackgroundErrors) != 1 {
		t.Errorf("failed rediscovery not counted")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestNewFailsLoudly(t *testing.T) {
	topo := loadTopology(t, "pcie-4.txt")
	topo.GPUs[0].ProductName = strings.Repeat("p", 80)
	e := newEnv(t, topo)
	if _, err := e.newDriver(); err == nil || !strings.Contains(err.Error(), "productName") {
		t.Fatalf("error %v, want the over-long productName reported", err)
	}
	e.disc.set(nil, errors.New("no NVML"))
	if _, err := e.newDriver(); err == nil || !strings.Contains(err.Error(), "no NVML") {
		t.Fatalf("error %v", err)
	}
}

func TestHandleError(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	d := e.start()
	ctx, cancel := context.WithCancelCause(e.ctx)
	defer cancel(nil)
	d.fatal = cancel

	// A recoverable error is only counted.
	d.HandleError(ctx, recoverable{errors.New("conflict")}, "publishing")
	if ctx.Err() != nil {
		t.Fatal("recoverable error stopped the plugin")
	}
	// Dropped fields (taints or consumable capacity disabled) stop it.
	d.HandleError(ctx, recoverable{&resourceslice.DroppedFieldsError{PoolName: testNode,
		DesiredSlice: &resourceapi.ResourceSlice{}, ActualSlice: &resourceapi.ResourceSlice{}}}, "publishing")
	if cause := context.Cause(ctx); cause == nil || !strings.Contains(cause.Error(), "dropped fields") {
		t.Fatalf("cause %v, want a dropped-fields stop", cause)
	}
	if got := testutil.ToFloat64(d.metrics.BackgroundErrors); got != 2 {
		t.Errorf("background errors %v, want 2", got)
	}
	if err := d.WatchHealthStatus(ctx, nil); !errors.Is(err, draplugin.ErrHealthNotSupported) {
		t.Errorf("WatchHealthStatus = %v", err)
	}
}

// recoverable marks an error recoverable the way the helper does.
type recoverable struct{ error }

func (r recoverable) Is(target error) bool { return target == draplugin.ErrRecoverable }
func (r recoverable) Unwrap() error        { return r.error }

func BenchmarkPrepare(b *testing.B) {
	e := newEnv(b, loadTopology(b, "v100-sxm2-8-aliyun-sccgn6.txt"))
	d := e.start()
	// Production runs at -v=0; the test logger would dominate the timing.
	ctx := klog.NewContext(context.Background(), klog.Background().V(10))
	durations := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		var results []resourceapi.DeviceRequestAllocationResult
		if i%2 == 0 {
			results = []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0), wholeGPU("g", 1), wholeGPU("g", 2), wholeGPU("g", 3)}
		} else {
			results = []resourceapi.DeviceRequestAllocationResult{shareOf("s", 5, "4Gi", 25)}
		}
		c := newClaim("bench", results)
		start := time.Now()
		res, err := d.PrepareResourceClaims(ctx, []*resourceapi.ResourceClaim{c})
		durations = append(durations, time.Since(start))
		if err != nil || res[c.UID].Err != nil {
			b.Fatal(err, res[c.UID].Err)
		}
		b.StopTimer()
		if errs, err := d.UnprepareResourceClaims(ctx, []draplugin.NamespacedObject{{UID: c.UID}}); err != nil || errs[c.UID] != nil {
			b.Fatal(err, errs[c.UID])
		}
		b.StartTimer()
	}
	b.StopTimer()
	slices.Sort(durations)
	b.ReportMetric(float64(durations[len(durations)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(durations[len(durations)*99/100].Microseconds())/1000, "p99-ms")
}
