package driver

import "testing"

func TestDeviceNameRoundTrip(t *testing.T) {
	for _, index := range []int{0, 7, 15, 63} {
		got, err := ParseDeviceName(DeviceName(index))
		if err != nil || got != index {
			t.Errorf("ParseDeviceName(DeviceName(%d)) = %d, %v", index, got, err)
		}
	}
}

func TestParseDeviceNameRejects(t *testing.T) {
	for _, name := range []string{"", "gpu-", "gpu--1", "gpu-01", "gpu-1a", "gpu-+1", "mig-1", "GPU-1", "gpu-0x1"} {
		if _, err := ParseDeviceName(name); err == nil {
			t.Errorf("ParseDeviceName(%q) accepted an invalid name", name)
		}
	}
}

func TestGroupAttr(t *testing.T) {
	if got := GroupAttr(4); got != "group4" {
		t.Errorf("GroupAttr(4) = %q, want group4", got)
	}
}

func TestMIGDeviceNameRoundTrip(t *testing.T) {
	for _, c := range [][3]int{{0, 0, 0}, {7, 13, 2}, {63, 1, 7}} {
		name := MIGDeviceName(c[0], c[1], c[2])
		if !IsMIGDeviceName(name) {
			t.Errorf("IsMIGDeviceName(%q) = false", name)
		}
		p, gi, ci, err := ParseMIGDeviceName(name)
		if err != nil || p != c[0] || gi != c[1] || ci != c[2] {
			t.Errorf("ParseMIGDeviceName(%q) = %d, %d, %d, %v; want %v", name, p, gi, ci, err, c)
		}
		if _, err := ParseDeviceName(name); err == nil {
			t.Errorf("ParseDeviceName(%q) accepted a MIG device name as a GPU", name)
		}
	}
	if got := MIGDeviceName(3, 1, 0); got != "gpu-3-mig-1-0" {
		t.Errorf("MIGDeviceName(3, 1, 0) = %q, want gpu-3-mig-1-0", got)
	}
}

func TestParseMIGDeviceNameRejects(t *testing.T) {
	for _, name := range []string{"gpu-0", "gpu-0-mig-", "gpu-0-mig-1", "gpu-0-mig-1-", "gpu-0-mig-01-0", "gpu-0-mig-1--1", "gpu-x-mig-1-0", "gpu-0-mig-1-0-0", "mig-1-0"} {
		if _, _, _, err := ParseMIGDeviceName(name); err == nil {
			t.Errorf("ParseMIGDeviceName(%q) accepted an invalid name", name)
		}
	}
}
