package discovery

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// busIDPattern accepts the spellings NVML and sysfs use for a PCI address:
// NVML pads the domain to 8 hex digits ("00000000:07:00.0"), sysfs to 4
// ("0000:07:00.0"), and older NVML versions print upper-case hex.
var busIDPattern = regexp.MustCompile(`^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$`)

// pciAddress is a parsed PCI bus ID.
type pciAddress struct {
	domain, bus, device, function uint32
}

func parseBusID(raw string) (pciAddress, error) {
	m := busIDPattern.FindStringSubmatch(raw)
	if m == nil {
		return pciAddress{}, fmt.Errorf("PCI bus ID %q: want <domain>:<bus>:<device>.<function> in hex", raw)
	}
	var f [4]uint32
	for i, s := range m[1:5] {
		v, err := strconv.ParseUint(s, 16, 32)
		if err != nil {
			return pciAddress{}, fmt.Errorf("PCI bus ID %q: %w", raw, err)
		}
		f[i] = uint32(v)
	}
	if f[2] > 0x1f {
		return pciAddress{}, fmt.Errorf("PCI bus ID %q: device number %#x exceeds 0x1f", raw, f[2])
	}
	return pciAddress{domain: f[0], bus: f[1], device: f[2], function: f[3]}, nil
}

// String is the form sysfs and the resource.kubernetes.io/pciBusID
// attribute use: lower-case hex, domain at least 4 digits. Domains above
// 0xffff (Intel VMD) keep their extra digits, as the kernel prints them.
func (a pciAddress) String() string {
	return fmt.Sprintf("%04x:%02x:%02x.%x", a.domain, a.bus, a.device, a.function)
}

// canonicalBusID rewrites any accepted spelling of a PCI address into the
// canonical one, e.g. "00000000:07:00.0" into "0000:07:00.0".
func canonicalBusID(raw string) (string, error) {
	a, err := parseBusID(raw)
	if err != nil {
		return "", err
	}
	return a.String(), nil
}

// CanonicalBusID is canonicalBusID for other packages: the GPU acceptance
// suite compares nvidia-smi's bus IDs with the ones discovery reports.
func CanonicalBusID(raw string) (string, error) { return canonicalBusID(raw) }

var errEmptyBusID = errors.New("PCI info has an empty bus ID")

// pciInfoBusID returns the canonical bus ID in an NVML PciInfo. BusId is a
// NUL-terminated C string in a fixed-size array.
func pciInfoBusID(p nvml.PciInfo) (string, error) {
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	if len(b) == 0 {
		return "", errEmptyBusID
	}
	return canonicalBusID(string(b))
}

// nvmlPCIInfo fills the address fields of p the way the real library does:
// BusId with an 8-digit upper-case domain, BusIdLegacy with a 4-digit one,
// and the numeric fields. Other fields (device IDs) are left alone.
func nvmlPCIInfo(p nvml.PciInfo, a pciAddress) nvml.PciInfo {
	p.BusId = [32]int8{}
	p.BusIdLegacy = [16]int8{}
	putCString(p.BusId[:], fmt.Sprintf("%08X:%02X:%02X.%X", a.domain, a.bus, a.device, a.function))
	if a.domain <= 0xffff {
		putCString(p.BusIdLegacy[:], fmt.Sprintf("%04X:%02X:%02X.%X", a.domain, a.bus, a.device, a.function))
	}
	p.Domain, p.Bus, p.Device = a.domain, a.bus, a.device
	return p
}

// putCString copies s into dst, leaving room for the terminating NUL.
func putCString(dst []int8, s string) {
	for i := 0; i < len(s) && i < len(dst)-1; i++ {
		dst[i] = int8(s[i])
	}
}
