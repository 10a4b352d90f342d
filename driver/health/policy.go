package health

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Kind is what happened to a GPU.
type Kind string

// Event kinds. The strings are the "kind" values of the injected-events
// file, so they are part of the plugin's interface.
const (
	// KindXID is an XID error the driver raised for the GPU; XID says which.
	KindXID Kind = "xid"
	// KindECCDoubleBit is an uncorrectable (double-bit) ECC memory error.
	KindECCDoubleBit Kind = "ecc-dbe"
	// KindGPULost is a GPU that no longer answers (NVML_ERROR_GPU_IS_LOST,
	// fallen off the bus).
	KindGPULost Kind = "gpu-lost"
	// KindRowRemapFailure is a failed row remap: memory with an error
	// that could not be replaced by a spare row.
	KindRowRemapFailure Kind = "row-remap-failure"
	// KindThermal is thermal slowdown (hardware or software): the GPU is
	// throttled but computes correctly.
	KindThermal Kind = "thermal"
	// KindRecovered clears a condition (Condition set: the GPU answers
	// again, the remap failure is gone after a reset) or, with Condition
	// empty, every condition of the GPU (an operator's explicit clear).
	KindRecovered Kind = "recovered"
)

var kinds = []Kind{KindXID, KindECCDoubleBit, KindGPULost, KindRowRemapFailure, KindThermal, KindRecovered}

// ParseKind returns the Kind named s, or an error listing the valid ones.
func ParseKind(s string) (Kind, error) {
	if k := Kind(s); slices.Contains(kinds, k) {
		return k, nil
	}
	names := make([]string, len(kinds))
	for i, k := range kinds {
		names[i] = string(k)
	}
	return "", fmt.Errorf("unknown event kind %q (want one of %s)", s, strings.Join(names, ", "))
}

// Event is one observation about one GPU.
type Event struct {
	// Device is the GPU's device name in the ResourceSlice (gpu-<index>).
	Device string
	// UUID is the GPU's UUID when the source knows it.
	UUID string
	Kind Kind
	// XID is the XID number of a KindXID event.
	XID uint64
	// Condition is the condition a KindRecovered event clears (empty:
	// all of them).
	Condition string
	// Message is the source's detail, shown in events and logs.
	Message string
	// Time is when the source saw it.
	Time time.Time
}

// Verdict is what an event means for the GPU.
type Verdict string

// Verdicts; the strings are the "verdict" label of the plugin's
// health_events_total metric.
const (
	// Fatal: the GPU must not get new work; it is tainted until it
	// recovers or an operator clears it.
	Fatal Verdict = "fatal"
	// Warning: worth an event and a metric, not a taint.
	Warning Verdict = "warning"
	// Ignored: caused by the application (bad memory access, killed
	// process), says nothing about the GPU.
	Ignored Verdict = "ignored"
	// Recovered: a condition is gone.
	Recovered Verdict = "recovered"
)

// Verdicts lists every verdict (for metrics that export all series).
var Verdicts = []Verdict{Fatal, Warning, Ignored, Recovered}

// DefaultFatalXIDs are the XIDs after which a GPU gets no new work until
// it is reset (see NVIDIA's XID catalog, "Resolution bucket"):
//
//	48  double-bit ECC error: memory returned wrong data
//	62  internal micro-controller halt
//	63  ECC page retirement / row remap recorded: the remap only takes
//	    effect at the next GPU reset, until then the bad row is in use
//	64  ECC page retirement / row remap recording failure
//	74  NVLink error: the GPU's links (which gpulink allocates by) are down
//	    or degraded
//	79  GPU has fallen off the bus
//	92  high single-bit ECC error rate: the memory is failing
//	94  contained ECC error: uncorrectable, the rows need a reset to remap
//	95  uncontained ECC error: every application on the GPU is affected
//	119 GSP RPC timeout: the GPU's system processor stopped answering
//	120 GSP error
var DefaultFatalXIDs = []uint64{48, 62, 63, 64, 74, 79, 92, 94, 95, 119, 120}

// DefaultIgnoredXIDs are XIDs an application causes on a healthy GPU:
//
//	13  graphics engine exception (out-of-range access, bad instruction)
//	31  GPU memory page fault (illegal address)
//	43  GPU stopped processing (the application's channel was aborted)
//	45  preemptive cleanup (a process exited or was killed)
//	68  video processor exception (bad input to NVDEC/NVENC)
//	109 context switch timeout (a long-running kernel)
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// Policy turns events into verdicts. An XID in neither list is a Warning:
// unknown XIDs are reported but do not take a GPU away.
type Policy struct {
	FatalXIDs   []uint64
	IgnoredXIDs []uint64
}

// DefaultPolicy returns the documented defaults.
func DefaultPolicy() Policy {
	return Policy{FatalXIDs: slices.Clone(DefaultFatalXIDs), IgnoredXIDs: slices.Clone(DefaultIgnoredXIDs)}
}

// Validate refuses an XID listed both as fatal and as ignored.
func (p Policy) Validate() error {
	for _, x := range p.FatalXIDs {
		if slices.Contains(p.IgnoredXIDs, x) {
			return fmt.Errorf("XID %d is listed both as fatal and as ignored", x)
		}
	}
	return nil
}

// Classify returns the event's verdict.
func (p Policy) Classify(e Event) Verdict {
	switch e.Kind {
	case KindXID:
		switch {
		case slices.Contains(p.FatalXIDs, e.XID):
			return Fatal
		case slices.Contains(p.IgnoredXIDs, e.XID):
			return Ignored
		default:
			return Warning
		}
	case KindECCDoubleBit, KindGPULost, KindRowRemapFailure:
		return Fatal
	case KindThermal:
		return Warning
	case KindRecovered:
		return Recovered
	default:
		return Ignored
	}
}

// FatalCondition names the fatal condition an event sets: "xid-79", "ecc-dbe",
// "gpu-lost", "row-remap-failure". It is a valid label value, so it can
// be a taint's value.
func (e Event) FatalCondition() string {
	if e.Kind == KindXID {
		return "xid-" + strconv.FormatUint(e.XID, 10)
	}
	return string(e.Kind)
}

// ParseXIDs parses a comma-separated list of XID numbers ("48,79"); an
// empty string is an empty list. flag names the flag in errors.
func ParseXIDs(flag, s string) ([]uint64, error) {
	var out []uint64
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		x, err := strconv.ParseUint(f, 10, 64)
		if err != nil || x == 0 {
			return nil, fmt.Errorf("%s: %q is not an XID number (a positive integer) in %q", flag, f, s)
		}
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out, nil
}

// FormatXIDs is the inverse of ParseXIDs (for flag defaults).
func FormatXIDs(xids []uint64) string {
	s := make([]string, len(xids))
	for i, x := range xids {
		s[i] = strconv.FormatUint(x, 10)
	}
	return strings.Join(s, ",")
}
