// Package mig is gpulink's model of NVIDIA Multi-Instance GPU: profiles,
// the names nvidia-smi gives them, placements, and the instances that exist
// on a GPU in MIG mode. It is part of the domain core and imports neither
// NVML nor client-go: discovery fills it in from NVML, the kubelet plugin
// publishes it, the controller places requests on it.
//
// # Profile names
//
// NVML's profile info carries no name on the drivers the go-nvml mocks
// simulate, so names are derived as nvidia-smi prints them:
// "<compute slices>g.<memory>gb", the memory being the profile's share of
// the GPU's memory rounded up to eighths, times the GPU's memory in whole
// GB (rounded up): an A100 40GB's 4864 MiB profile is 1g.5gb, its 9856 MiB
// one 1g.10gb. Profiles with extra media engines get "+me", those without
// any "-me", the graphics ones "+gfx". A compute instance smaller than its
// GPU instance is named "<ci slices>c.<GPU instance name>" (1c.3g.20gb).
package mig

import (
	"fmt"
	"math"
	"strconv"
)

// Placement is where a GPU instance sits on its GPU, in memory slices
// (an A100 has 8; a 3g instance takes 4 of them).
type Placement struct {
	Start int `json:"start"`
	Size  int `json:"size"`
}

// End is the first memory slice after the placement.
func (p Placement) End() int { return p.Start + p.Size }

// Overlaps reports whether two placements share a memory slice.
func (p Placement) Overlaps(o Placement) bool { return p.Start < o.End() && o.Start < p.End() }

// Profile is a MIG profile: a GPU instance profile and, where a compute
// instance takes only part of it, a compute instance profile.
type Profile struct {
	// Name is the nvidia-smi name, e.g. "1g.5gb" or "1c.3g.20gb".
	Name string `json:"name"`
	// GIProfileID and CIProfileID are NVML's profile IDs
	// (nvml.GPU_INSTANCE_PROFILE_*, nvml.COMPUTE_INSTANCE_PROFILE_*).
	GIProfileID int `json:"giProfileID"`
	CIProfileID int `json:"ciProfileID"`
	// GISlices and CISlices are compute slices of the GPU instance and of
	// the compute instance.
	GISlices        int   `json:"giSlices"`
	CISlices        int   `json:"ciSlices"`
	MemoryBytes     int64 `json:"memoryBytes"`
	Multiprocessors int   `json:"multiprocessors"`
	CopyEngines     int   `json:"copyEngines,omitempty"`
	Decoders        int   `json:"decoders,omitempty"`
	Encoders        int   `json:"encoders,omitempty"`
	JPEGs           int   `json:"jpegs,omitempty"`
	OFAs            int   `json:"ofas,omitempty"`
}

// Instance is one MIG device that exists on a GPU: a compute instance
// inside a GPU instance.
type Instance struct {
	Profile Profile `json:"profile"`
	// GI and CI are the GPU and compute instance IDs NVML gives them.
	GI int `json:"gi"`
	CI int `json:"ci"`
	// Placement is the GPU instance's placement.
	Placement Placement `json:"placement"`
	// UUID is the MIG device's UUID ("MIG-..."), what
	// NVIDIA_VISIBLE_DEVICES names it by; empty when unknown.
	UUID string `json:"uuid,omitempty"`
	// GICapMinor and CICapMinor are the minors of
	// /dev/nvidia-caps/nvidia-cap<minor> that grant access to the GPU
	// and the compute instance; -1 when unknown.
	GICapMinor int `json:"giCapMinor"`
	CICapMinor int `json:"ciCapMinor"`
}

// GPU is the MIG state of one GPU.
type GPU struct {
	// Enabled: the GPU is in MIG mode (current mode; a pending change
	// needs a GPU reset gpulink never does). Such a GPU is only ever
	// given out as its MIG devices, never whole or in shares.
	Enabled bool `json:"enabled"`
	// Instances are the MIG devices that exist, by GI then CI.
	Instances []Instance `json:"instances,omitempty"`
	// Profiles are the GPU instance profiles the GPU supports, with the
	// placements NVML allows for each (ondemand.go), by profile ID.
	Profiles []GIProfile `json:"profiles,omitempty"`
	// OnDemand: the kubelet plugin partitions this GPU on demand,
	// creating and destroying its instances for claims, and publishes its
	// Profiles' partitions instead of its Instances. It is the plugin's
	// configuration (--mig-on-demand), never discovered; gpulink never
	// changes a GPU's MIG mode.
	OnDemand bool `json:"onDemand,omitempty"`
}

// Profile suffixes by NVML GPU instance profile ID; see the package doc.
// The IDs are nvml.GPU_INSTANCE_PROFILE_* (stable C ABI values), repeated
// here so that the domain core does not import go-nvml.
var giProfileSuffix = map[int]string{
	7:  "+me",  // 1_SLICE_REV1
	8:  "+me",  // 2_SLICE_REV1
	10: "+gfx", // 1_SLICE_GFX
	11: "+gfx", // 2_SLICE_GFX
	12: "+gfx", // 4_SLICE_GFX
	13: "-me",  // 1_SLICE_NO_ME
	14: "-me",  // 2_SLICE_NO_ME
	15: "+me.all",
	16: "+me.all",
	17: "+gfx", // 3_SLICE_GFX
}

// GIProfileName names a GPU instance profile: giSlices compute slices
// with memMiB of memory on a GPU with gpuMemBytes in total.
func GIProfileName(giProfileID, giSlices int, memMiB uint64, gpuMemBytes int64) (string, error) {
	if giSlices <= 0 {
		return "", fmt.Errorf("GPU instance profile %d: %d compute slices", giProfileID, giSlices)
	}
	gb, err := memoryGB(memMiB, gpuMemBytes)
	if err != nil {
		return "", fmt.Errorf("GPU instance profile %d: %w", giProfileID, err)
	}
	return strconv.Itoa(giSlices) + "g." + strconv.FormatUint(gb, 10) + "gb" + giProfileSuffix[giProfileID], nil
}

// ProfileName is the name of a compute instance of ciSlices in a GPU
// instance named giName of giSlices.
func ProfileName(giName string, giSlices, ciSlices int) string {
	if ciSlices == giSlices {
		return giName
	}
	return strconv.Itoa(ciSlices) + "c." + giName
}

// memoryGB rounds a profile's memory as nvidia-smi's names do: its share
// of the GPU's memory up to eighths, times the GPU's memory in GB rounded
// up. Firmware reserves part of each memory slice, so the raw MiB figure
// (4864 for a "5gb" profile) is always a little below the name.
func memoryGB(memMiB uint64, gpuMemBytes int64) (uint64, error) {
	const gib = 1 << 30
	if gpuMemBytes <= 0 {
		return 0, fmt.Errorf("GPU memory %d bytes is unknown", gpuMemBytes)
	}
	if memMiB == 0 || memMiB<<20 > uint64(gpuMemBytes) {
		return 0, fmt.Errorf("profile memory %d MiB is not within the GPU's %d bytes", memMiB, gpuMemBytes)
	}
	eighths := math.Ceil(float64(memMiB<<20) / float64(gpuMemBytes) * 8)
	gpuGB := float64((gpuMemBytes + gib - 1) / gib)
	return uint64(math.Round(eighths / 8 * gpuGB)), nil
}
