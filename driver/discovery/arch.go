package discovery

import (
	"maps"
	"slices"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// archNames maps NVML's architecture enum to the lower-case names the
// NVIDIA GPU DRA driver publishes, so CEL selectors carry over unchanged.
// DLA and NPU values are not GPUs and are deliberately absent.
var archNames = map[nvml.DeviceArchitecture]string{
	nvml.DEVICE_ARCH_KEPLER:    "kepler",
	nvml.DEVICE_ARCH_MAXWELL:   "maxwell",
	nvml.DEVICE_ARCH_PASCAL:    "pascal",
	nvml.DEVICE_ARCH_VOLTA:     "volta",
	nvml.DEVICE_ARCH_TURING:    "turing",
	nvml.DEVICE_ARCH_AMPERE:    "ampere",
	nvml.DEVICE_ARCH_ADA:       "ada",
	nvml.DEVICE_ARCH_HOPPER:    "hopper",
	nvml.DEVICE_ARCH_BLACKWELL: "blackwell",
	nvml.DEVICE_ARCH_RUBIN:     "rubin",
}

// archFromComputeCapability names the architecture a CUDA compute
// capability belongs to. It is the fallback when NVML is too old to know
// the architecture enum (or reports it as unknown) and the default for
// topology files. It returns "" for capabilities it does not know.
func archFromComputeCapability(major, minor int) string {
	switch major {
	case 3:
		return "kepler"
	case 5:
		return "maxwell"
	case 6:
		return "pascal"
	case 7:
		if minor >= 5 {
			return "turing"
		}
		return "volta"
	case 8:
		if minor >= 9 {
			return "ada"
		}
		return "ampere"
	case 9:
		return "hopper"
	case 10, 11, 12:
		return "blackwell"
	}
	return ""
}

// knownArchitecture reports whether name is one of the names archNames uses.
func knownArchitecture(name string) bool {
	return slices.Contains(architectureNames(), name)
}

// architectureNames lists the names archNames uses, sorted.
func architectureNames() []string {
	return slices.Sorted(maps.Values(archNames))
}
