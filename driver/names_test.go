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
