// Package health is gpulink's GPU health policy: which events make a GPU
// unfit for new work (fatal), which are only reported (warning), and
// which say nothing about the GPU (ignored, application XIDs), and the
// per-GPU record of active fatal conditions that the kubelet plugin turns
// into device taints and health reports.
//
// It imports no client-go and no NVML: event sources (NVML, injected
// events) live in package kubeletplugin and feed Events in.
//
// # Verdicts
//
//	xid                XID in Policy.FatalXIDs: fatal; in IgnoredXIDs:
//	                   ignored; any other XID: warning
//	ecc-dbe            fatal (uncorrectable memory error)
//	gpu-lost           fatal (fallen off the bus, NVML_ERROR_GPU_IS_LOST)
//	row-remap-failure  fatal (no spare row left for a failed one)
//	thermal            warning (throttled, still correct)
//	recovered          clears one condition, or all of them
//
// DefaultFatalXIDs and DefaultIgnoredXIDs document each XID and why.
//
// # Conditions
//
// A fatal event sets a condition named after it ("xid-79", "gpu-lost");
// a repeat keeps the time it was first seen. A GPU is healthy when it has
// no condition. A recovered event with a condition clears that one (the
// source saw the GPU answer again); without one it clears them all (an
// operator's explicit clear, after a GPU reset).
package health
