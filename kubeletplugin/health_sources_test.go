package kubeletplugin

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"k8s.io/klog/v2/ktesting"

	"github.com/gpulink/gpulink/driver/health"
)

// recordingSink keeps what a source reports.
type recordingSink struct {
	mu      sync.Mutex
	events  []health.Event
	failing error
	// checks counts SourceFailing calls (a source's rounds).
	checks  int
	changed chan struct{}
}

func newRecordingSink() *recordingSink { return &recordingSink{changed: make(chan struct{}, 1000)} }

func (s *recordingSink) Report(e health.Event) {
	s.mu.Lock()
	s.events = append(s.events, e)
	s.mu.Unlock()
	s.changed <- struct{}{}
}

func (s *recordingSink) SourceFailing(err error) {
	s.mu.Lock()
	s.failing = err
	s.checks++
	s.mu.Unlock()
}

func (s *recordingSink) waitChecks(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.mu.Lock()
		n := s.checks
		s.mu.Unlock()
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("source never ran a round")
		}
		time.Sleep(time.Millisecond)
	}
}

// waitEvents waits until n events were reported and returns them.
func (s *recordingSink) waitEvents(t *testing.T, n int) []health.Event {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		if len(s.events) >= n {
			out := append([]health.Event(nil), s.events...)
			s.mu.Unlock()
			return out
		}
		s.mu.Unlock()
		select {
		case <-s.changed:
		case <-deadline:
			t.Fatalf("waited for %d events, have %v", n, s.events)
		}
	}
}

func TestParseInjectedEvent(t *testing.T) {
	for _, tc := range []struct {
		line    string
		want    health.Event
		wantErr string
	}{
		{`{"device":"gpu-1","kind":"xid","xid":79,"message":"m"}`, health.Event{Device: "gpu-1", Kind: health.KindXID, XID: 79, Message: "m"}, ""},
		{`{"uuid":"GPU-1","kind":"gpu-lost"}`, health.Event{UUID: "GPU-1", Kind: health.KindGPULost}, ""},
		{`{"device":"gpu-1","kind":"recovered"}`, health.Event{Device: "gpu-1", Kind: health.KindRecovered}, ""},
		{`{"device":"gpu-1","kind":"recovered","condition":"xid-79"}`, health.Event{Device: "gpu-1", Kind: health.KindRecovered, Condition: "xid-79"}, ""},
		{`{"device":"gpu-1","kind":"melted"}`, health.Event{}, `field kind: unknown event kind "melted"`},
		{`{"kind":"gpu-lost"}`, health.Event{}, "field device or uuid"},
		{`{"device":"gpu-1","kind":"xid"}`, health.Event{}, "field xid: required"},
		{`{"device":"gpu-1","kind":"gpu-lost","xid":79}`, health.Event{}, "field xid: 79 given"},
		{`{"device":"gpu-1","kind":"xid","xid":79,"condition":"x"}`, health.Event{}, "field condition"},
		{`{"device":"gpu-1","kind":"xid","xid":79,"colour":"red"}`, health.Event{}, `unknown field "colour"`},
		{`gpu-1 is broken`, health.Event{}, "not a health event object"},
	} {
		got, err := ParseInjectedEvent([]byte(tc.line))
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: error %v, want one containing %q", tc.line, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("%s: got %+v, %v; want %+v", tc.line, got, err, tc.want)
		}
	}
}

func TestFileHealthSource(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	path := filepath.Join(t.TempDir(), "events.jsonl")
	appendLine := func(s string) {
		t.Helper()
		f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
		if err := f.Close(); err != nil {
			t.Fatal(err)
		}
	}
	// Written before the plugin started: already applied then, skipped.
	appendLine(`{"device":"gpu-0","kind":"xid","xid":48}` + "\n")
	sink := newRecordingSink()
	src := &FileHealthSource{Path: path, PollInterval: 5 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()
	sink.waitChecks(t)

	appendLine(`{"device":"gpu-1","kind":"xid","xid":79}` + "\n" + "not json\n\n" + `{"device":"gpu-1","kind":"recov`)
	got := sink.waitEvents(t, 1)
	if got[0].Device != "gpu-1" || got[0].XID != 79 || got[0].Time.IsZero() {
		t.Fatalf("first event %+v, want gpu-1 XID 79 with a time", got[0])
	}
	// The partial line counts once complete.
	appendLine(`ered"}` + "\n")
	got = sink.waitEvents(t, 2)
	if got[1].Device != "gpu-1" || got[1].Kind != health.KindRecovered {
		t.Fatalf("second event %+v, want gpu-1 recovered", got[1])
	}
	// A replaced (shorter) file is read from its start.
	if err := os.WriteFile(path, []byte(`{"uuid":"GPU-2","kind":"gpu-lost"}`+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	got = sink.waitEvents(t, 3)
	if got[2].UUID != "GPU-2" || got[2].Kind != health.KindGPULost {
		t.Fatalf("event after truncation %+v", got[2])
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if len(sink.events) != 3 {
		t.Errorf("%d events, want 3 (the line from before the start and the bad line skipped): %+v", len(sink.events), sink.events)
	}
	if sink.failing != nil {
		t.Errorf("source failing: %v", sink.failing)
	}
}

// nvmlBox is a go-nvml mock of a node whose GPUs' answers tests change.
type nvmlBox struct {
	mu       sync.Mutex
	lib      *mock.Interface
	devs     []*mock.Device
	lost     []bool
	remap    []bool
	reasons  []uint64
	events   chan nvml.EventData
	waitErr  nvml.Return
	register []uint64
}

func newNVMLBox(n int) *nvmlBox {
	b := &nvmlBox{lost: make([]bool, n), remap: make([]bool, n), reasons: make([]uint64, n), register: make([]uint64, n), events: make(chan nvml.EventData, 10), waitErr: nvml.ERROR_TIMEOUT}
	set := &mock.EventSet{
		WaitFunc: func(timeout uint32) (nvml.EventData, nvml.Return) {
			select {
			case e := <-b.events:
				return e, nvml.SUCCESS
			case <-time.After(time.Duration(timeout) * time.Millisecond):
				b.mu.Lock()
				defer b.mu.Unlock()
				return nvml.EventData{}, b.waitErr
			}
		},
		FreeFunc: func() nvml.Return { return nvml.SUCCESS },
	}
	for i := range n {
		d := &mock.Device{}
		d.GetUUIDFunc = func() (string, nvml.Return) { return "GPU-" + string(rune('a'+i)), nvml.SUCCESS }
		d.GetSupportedEventTypesFunc = func() (uint64, nvml.Return) {
			return nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError | nvml.EventTypeSingleBitEccError, nvml.SUCCESS
		}
		d.RegisterEventsFunc = func(mask uint64, _ nvml.EventSet) nvml.Return {
			b.mu.Lock()
			defer b.mu.Unlock()
			b.register[i] = mask
			return nvml.SUCCESS
		}
		d.GetRemappedRowsFunc = func() (int, int, bool, bool, nvml.Return) {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.lost[i] {
				return 0, 0, false, false, nvml.ERROR_GPU_IS_LOST
			}
			return 0, 1, false, b.remap[i], nvml.SUCCESS
		}
		d.GetCurrentClocksEventReasonsFunc = func() (uint64, nvml.Return) {
			b.mu.Lock()
			defer b.mu.Unlock()
			if b.lost[i] {
				return 0, nvml.ERROR_GPU_IS_LOST
			}
			return b.reasons[i], nvml.SUCCESS
		}
		b.devs = append(b.devs, d)
	}
	b.lib = &mock.Interface{
		InitFunc:           func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
		DeviceGetCountFunc: func() (int, nvml.Return) { return n, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (nvml.Device, nvml.Return) {
			return b.devs[i], nvml.SUCCESS
		},
		EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return set, nvml.SUCCESS },
	}
	return b
}

func (b *nvmlBox) set(f func()) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f()
}

func TestNVMLHealthSource(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	ctx, cancel := context.WithCancel(ctx)
	b := newNVMLBox(2)
	b.set(func() { b.remap[1] = true })
	sink := newRecordingSink()
	src := &NVMLHealthSource{Lib: b.lib, PollInterval: time.Millisecond, WaitTimeout: time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, sink) }()

	// First poll: both GPUs answer (recoveries that clear stale
	// conditions), GPU b has a row remap failure.
	type want struct {
		uuid      string
		kind      health.Kind
		xid       uint64
		condition string
	}
	check := func(got []health.Event, wants ...want) {
		t.Helper()
		if len(got) != len(wants) {
			t.Fatalf("events %+v, want %+v", got, wants)
		}
		for i, w := range wants {
			g := got[i]
			if g.UUID != w.uuid || g.Kind != w.kind || g.XID != w.xid || g.Condition != w.condition || g.Time.IsZero() {
				t.Errorf("event %d = %+v, want %+v", i, g, w)
			}
		}
	}
	got := sink.waitEvents(t, 4)
	check(got[:4],
		want{"GPU-a", health.KindRecovered, 0, "gpu-lost"},
		want{"GPU-a", health.KindRecovered, 0, "row-remap-failure"},
		want{"GPU-b", health.KindRecovered, 0, "gpu-lost"},
		want{"GPU-b", health.KindRowRemapFailure, 0, ""},
	)
	b.mu.Lock()
	for i, m := range b.register {
		if m != nvml.EventTypeXidCriticalError|nvml.EventTypeDoubleBitEccError {
			t.Errorf("GPU %d registered for %#x, want XID and double-bit ECC only", i, m)
		}
	}
	b.mu.Unlock()

	// Events from the event set.
	b.events <- nvml.EventData{Device: b.devs[0], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
	b.events <- nvml.EventData{Device: b.devs[1], EventType: nvml.EventTypeDoubleBitEccError}
	got = sink.waitEvents(t, 6)
	check(got[4:6], want{"GPU-a", health.KindXID, 79, ""}, want{"GPU-b", health.KindECCDoubleBit, 0, ""})

	// Thermal slowdown is reported once per episode.
	b.set(func() { b.reasons[0] = nvml.ClocksEventReasonSwThermalSlowdown | nvml.ClocksEventReasonGpuIdle })
	got = sink.waitEvents(t, 7)
	check(got[6:7], want{"GPU-a", health.KindThermal, 0, ""})

	// GPU a falls off the bus, then answers again; b's remap is fixed.
	b.set(func() { b.lost[0] = true })
	got = sink.waitEvents(t, 8)
	check(got[7:8], want{"GPU-a", health.KindGPULost, 0, ""})
	b.set(func() { b.lost[0], b.reasons[0], b.remap[1] = false, 0, false })
	got = sink.waitEvents(t, 10)
	// Both changes land between two polls, but a poll already past GPU a
	// when they land reports b's recovery first: the order across GPUs is
	// not part of the contract.
	recovered := slices.Clone(got[8:10])
	slices.SortFunc(recovered, func(x, y health.Event) int { return strings.Compare(x.UUID, y.UUID) })
	check(recovered, want{"GPU-a", health.KindRecovered, 0, "gpu-lost"}, want{"GPU-b", health.KindRecovered, 0, "row-remap-failure"})

	// NVML that stops answering ends the source with an error.
	b.set(func() { b.waitErr = nvml.ERROR_UNKNOWN })
	select {
	case err := <-done:
		if !errors.Is(err, nvml.ERROR_UNKNOWN) {
			t.Fatalf("Run = %v, want the NVML error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("source kept running with NVML failing")
	}
	cancel()
	if n := len(sink.events); n != 10 {
		t.Errorf("%d events, want 10 (thermal reported once): %+v", n, sink.events)
	}
}

func TestNVMLHealthSourceInitFailure(t *testing.T) {
	_, ctx := ktesting.NewTestContext(t)
	for _, tc := range []struct {
		name string
		lib  *mock.Interface
		want nvml.Return
	}{
		{"init", &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_DRIVER_NOT_LOADED }}, nvml.ERROR_DRIVER_NOT_LOADED},
		{"event set", &mock.Interface{
			InitFunc:           func() nvml.Return { return nvml.SUCCESS },
			ShutdownFunc:       func() nvml.Return { return nvml.SUCCESS },
			DeviceGetCountFunc: func() (int, nvml.Return) { return 1, nvml.SUCCESS },
			EventSetCreateFunc: func() (nvml.EventSet, nvml.Return) { return nil, nvml.ERROR_UNKNOWN },
		}, nvml.ERROR_UNKNOWN},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := (&NVMLHealthSource{Lib: tc.lib}).Run(ctx, newRecordingSink())
			if !errors.Is(err, tc.want) {
				t.Fatalf("Run = %v, want %v", err, tc.want)
			}
		})
	}
}
