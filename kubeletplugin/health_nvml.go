package kubeletplugin

import (
	"context"
	"fmt"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/health"
)

// nvmlEventMask is what the source registers for: XID critical errors
// (which include the XIDs of double-bit ECC errors and of a GPU fallen off
// the bus) and double-bit ECC errors.
const nvmlEventMask = uint64(nvml.EventTypeXidCriticalError | nvml.EventTypeDoubleBitEccError)

// thermalReasons are the clock event reasons that mean thermal slowdown.
const thermalReasons = uint64(nvml.ClocksEventReasonSwThermalSlowdown | nvml.ClocksThrottleReasonHwThermalSlowdown)

// NVMLHealthSource watches real GPUs through NVML: XID and double-bit ECC
// events from an event set, and, every PollInterval, whether each GPU
// still answers (NVML_ERROR_GPU_IS_LOST), whether a row remap failed
// (GetRemappedRows) and whether the GPU is thermally throttled (clock
// event reasons, a warning). A GPU that answers again, or whose remap
// failure is gone (after a reset), recovers from that condition.
type NVMLHealthSource struct {
	Lib nvml.Interface
	// PollInterval defaults to 10s.
	PollInterval time.Duration
	// WaitTimeout bounds one wait for events, so the source notices ctx
	// and polls in time (default 1s).
	WaitTimeout time.Duration
	now         func() time.Time
}

// Name implements HealthSource.
func (s *NVMLHealthSource) Name() string { return "nvml" }

// nvmlGPU is one GPU being watched and what was last seen of it.
type nvmlGPU struct {
	handle  nvml.Device
	uuid    string
	lost    bool
	remap   bool
	thermal bool
	polled  bool
}

// Run implements HealthSource. NVML that cannot be initialised, counted
// or waited on is an error: the GPUs cannot be watched at all.
func (s *NVMLHealthSource) Run(ctx context.Context, sink HealthSink) error {
	logger := klog.FromContext(ctx).WithValues("source", s.Name())
	poll, wait := s.PollInterval, s.WaitTimeout
	if poll <= 0 {
		poll = 10 * time.Second
	}
	if wait <= 0 {
		wait = time.Second
	}
	now := s.now
	if now == nil {
		now = time.Now
	}
	if ret := s.Lib.Init(); ret != nvml.SUCCESS {
		return fmt.Errorf("initialising NVML: %w", ret)
	}
	defer func() { _ = s.Lib.Shutdown() }()
	count, ret := s.Lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("counting GPUs: %w", ret)
	}
	set, ret := s.Lib.EventSetCreate()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("creating NVML event set: %w", ret)
	}
	defer func() { _ = set.Free() }()

	report := func(g *nvmlGPU, e health.Event) {
		e.UUID, e.Time = g.uuid, now()
		sink.Report(e)
	}
	gpus := make([]*nvmlGPU, 0, count)
	for i := range count {
		h, ret := s.Lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %d: getting handle: %w", i, ret)
		}
		uuid, ret := h.GetUUID()
		if ret != nvml.SUCCESS {
			// Discovery found it; a GPU that cannot name itself now is
			// lost, and without a UUID it cannot be reported: skip it.
			logger.Error(ret, "GPU does not answer, not watching it", "index", i)
			continue
		}
		g := &nvmlGPU{handle: h, uuid: uuid}
		gpus = append(gpus, g)
		supported, ret := h.GetSupportedEventTypes()
		switch {
		case ret == nvml.ERROR_GPU_IS_LOST:
			continue // the first poll reports it
		case ret != nvml.SUCCESS:
			logger.Info("GPU cannot report events, polling only", "uuid", uuid, "reason", ret.Error())
			continue
		}
		mask := supported & nvmlEventMask
		if mask == 0 {
			logger.Info("GPU supports neither XID nor ECC events, polling only", "uuid", uuid)
			continue
		}
		if ret := h.RegisterEvents(mask, set); ret != nvml.SUCCESS && ret != nvml.ERROR_GPU_IS_LOST {
			logger.Info("Registering GPU events failed, polling only", "uuid", uuid, "reason", ret.Error())
		}
	}
	logger.Info("Watching GPU health", "gpus", len(gpus), "pollInterval", poll)

	var lastPoll time.Time
	for {
		if t := now(); lastPoll.IsZero() || t.Sub(lastPoll) >= poll {
			lastPoll = t
			for _, g := range gpus {
				s.poll(g, report)
			}
		}
		if ctx.Err() != nil {
			return nil
		}
		data, ret := set.Wait(uint32(wait.Milliseconds()))
		switch ret {
		case nvml.SUCCESS:
		case nvml.ERROR_TIMEOUT:
			continue
		case nvml.ERROR_GPU_IS_LOST:
			// One GPU is gone; the next poll finds which.
			lastPoll = time.Time{}
			continue
		default:
			return fmt.Errorf("waiting for NVML events: %w", ret)
		}
		g := findGPU(gpus, data.Device)
		if g == nil {
			logger.Info("Event for a GPU that is not watched", "eventType", data.EventType, "data", data.EventData)
			continue
		}
		switch {
		case data.EventType&nvml.EventTypeXidCriticalError != 0:
			report(g, health.Event{Kind: health.KindXID, XID: data.EventData, Message: "NVML XID critical error event"})
		case data.EventType&nvml.EventTypeDoubleBitEccError != 0:
			report(g, health.Event{Kind: health.KindECCDoubleBit, Message: "NVML double-bit ECC error event"})
		}
	}
}

func findGPU(gpus []*nvmlGPU, h nvml.Device) *nvmlGPU {
	for _, g := range gpus {
		if g.handle == h {
			return g
		}
	}
	if h == nil {
		return nil
	}
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return nil
	}
	for _, g := range gpus {
		if g.uuid == uuid {
			return g
		}
	}
	return nil
}

// poll checks one GPU and reports changes since the last poll; the first
// poll of a GPU also reports recoveries, which clear conditions kept from
// before a plugin restart that no longer hold.
func (s *NVMLHealthSource) poll(g *nvmlGPU, report func(*nvmlGPU, health.Event)) {
	first := !g.polled
	g.polled = true
	_, _, _, failed, retRows := g.handle.GetRemappedRows()
	reasons, retClocks := g.handle.GetCurrentClocksEventReasons()
	lost := retRows == nvml.ERROR_GPU_IS_LOST || retClocks == nvml.ERROR_GPU_IS_LOST
	switch {
	case lost && !g.lost:
		report(g, health.Event{Kind: health.KindGPULost, Message: "NVML_ERROR_GPU_IS_LOST"})
	case !lost && (g.lost || first):
		report(g, health.Event{Kind: health.KindRecovered, Condition: string(health.KindGPULost), Message: "GPU answers again"})
	}
	g.lost = lost
	if lost {
		return
	}
	if retRows == nvml.SUCCESS {
		switch {
		case failed && !g.remap:
			report(g, health.Event{Kind: health.KindRowRemapFailure, Message: "GetRemappedRows: remapping failure occurred"})
		case !failed && (g.remap || first):
			report(g, health.Event{Kind: health.KindRecovered, Condition: string(health.KindRowRemapFailure), Message: "no row remapping failure"})
		}
		g.remap = failed
	}
	if retClocks == nvml.SUCCESS {
		thermal := reasons&thermalReasons != 0
		if thermal && !g.thermal {
			report(g, health.Event{Kind: health.KindThermal, Message: fmt.Sprintf("clock event reasons %#x", reasons)})
		}
		g.thermal = thermal
	}
}
