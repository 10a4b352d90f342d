package discovery

import (
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

func TestCanonicalBusID(t *testing.T) {
	tests := []struct {
		raw, want, wantErr string
	}{
		{raw: "00000000:07:00.0", want: "0000:07:00.0"},
		{raw: "0000:07:00.0", want: "0000:07:00.0"},
		{raw: "00000000:0F:1E.7", want: "0000:0f:1e.7"},
		{raw: "0:7:0.0", want: "0000:07:00.0"},
		{raw: "00010000:E1:00.0", want: "10000:e1:00.0"},
		{raw: "", wantErr: `PCI bus ID ""`},
		{raw: "07:00.0", wantErr: `PCI bus ID "07:00.0"`},
		{raw: "0000:07:00", wantErr: `PCI bus ID "0000:07:00"`},
		{raw: "000000000:07:00.0", wantErr: `PCI bus ID "000000000:07:00.0"`},
		{raw: "0000:07:00.8", wantErr: `PCI bus ID "0000:07:00.8"`},
		{raw: "0000:07:20.0", wantErr: "device number 0x20 exceeds 0x1f"},
		{raw: "0000:g7:00.0", wantErr: `PCI bus ID "0000:g7:00.0"`},
		{raw: " 0000:07:00.0", wantErr: `PCI bus ID " 0000:07:00.0"`},
	}
	for _, tc := range tests {
		t.Run(tc.raw, func(t *testing.T) {
			got, err := canonicalBusID(tc.raw)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("canonicalBusID(%q) = %q, %v; want error containing %q", tc.raw, got, err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("canonicalBusID(%q) = %q, %v; want %q", tc.raw, got, err, tc.want)
			}
		})
	}
}

func TestPCIInfoRoundTrip(t *testing.T) {
	tests := []struct {
		canonical, busID, legacy string
		domain, bus, device      uint32
	}{
		{canonical: "0000:07:00.0", busID: "00000000:07:00.0", legacy: "0000:07:00.0", bus: 7},
		{canonical: "0000:bd:1f.1", busID: "00000000:BD:1F.1", legacy: "0000:BD:1F.1", bus: 0xbd, device: 0x1f},
		{canonical: "10000:e1:00.0", busID: "00010000:E1:00.0", legacy: "", domain: 0x10000, bus: 0xe1},
	}
	for _, tc := range tests {
		t.Run(tc.canonical, func(t *testing.T) {
			a, err := parseBusID(tc.canonical)
			if err != nil {
				t.Fatalf("parseBusID: %v", err)
			}
			p := nvmlPCIInfo(nvml.PciInfo{PciDeviceId: 0x20b010de}, a)
			if got := cString(p.BusId[:]); got != tc.busID {
				t.Errorf("BusId = %q, want %q", got, tc.busID)
			}
			if got := cString(p.BusIdLegacy[:]); got != tc.legacy {
				t.Errorf("BusIdLegacy = %q, want %q", got, tc.legacy)
			}
			if p.Domain != tc.domain || p.Bus != tc.bus || p.Device != tc.device || p.PciDeviceId != 0x20b010de {
				t.Errorf("fields %#x:%#x:%#x device ID %#x, want %#x:%#x:%#x device ID 0x20b010de",
					p.Domain, p.Bus, p.Device, p.PciDeviceId, tc.domain, tc.bus, tc.device)
			}
			back, err := pciInfoBusID(p)
			if err != nil || back != tc.canonical {
				t.Errorf("pciInfoBusID = %q, %v; want %q", back, err, tc.canonical)
			}
		})
	}
}

func TestPCIInfoBusIDEmpty(t *testing.T) {
	if _, err := pciInfoBusID(nvml.PciInfo{}); !errors.Is(err, errEmptyBusID) {
		t.Fatalf("pciInfoBusID(empty) error = %v, want errEmptyBusID", err)
	}
}

func TestPCIInfoBusIDUnterminated(t *testing.T) {
	var p nvml.PciInfo
	for i := range p.BusId {
		p.BusId[i] = '0'
	}
	if _, err := pciInfoBusID(p); err == nil || !strings.Contains(err.Error(), "PCI bus ID") {
		t.Fatalf("pciInfoBusID(32 zeros) error = %v, want a PCI bus ID error", err)
	}
}

func cString(b []int8) string {
	var s []byte
	for _, c := range b {
		if c == 0 {
			break
		}
		s = append(s, byte(c))
	}
	return string(s)
}
