package driver

import (
	"strings"
	"testing"
)

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

func TestPartitionDeviceName(t *testing.T) {
	for _, c := range []struct {
		parent  int
		profile string
		start   int
		want    string
	}{
		{0, "1g.5gb", 3, "gpu-0-part-1g-5gb-at-3"},
		{7, "1g.5gb+me", 0, "gpu-7-part-1g-5gb-with-me-at-0"},
		{1, "1g.10gb-me", 6, "gpu-1-part-1g-10gb-no-me-at-6"},
		{15, "1g.12gb+me.all", 6, "gpu-15-part-1g-12gb-with-me-all-at-6"},
		{2, "7g.141gb", 0, "gpu-2-part-7g-141gb-at-0"},
	} {
		got, err := PartitionDeviceName(c.parent, c.profile, c.start)
		if err != nil || got != c.want {
			t.Errorf("PartitionDeviceName(%d, %q, %d) = %q, %v; want %q", c.parent, c.profile, c.start, got, err, c.want)
			continue
		}
		if !IsPartitionDeviceName(got) || IsMIGDeviceName(got) {
			t.Errorf("%q: IsPartitionDeviceName %v, IsMIGDeviceName %v; want true, false", got, IsPartitionDeviceName(got), IsMIGDeviceName(got))
		}
		if _, err := ParseDeviceName(got); err == nil {
			t.Errorf("ParseDeviceName(%q) accepted a partition name as a GPU", got)
		}
		if p, err := ParsePartitionParent(got); err != nil || p != c.parent {
			t.Errorf("ParsePartitionParent(%q) = %d, %v; want %d", got, p, err, c.parent)
		}
	}
	for _, bad := range []struct {
		profile string
		start   int
	}{{"1g.5gb_x", 0}, {"", 0}, {"1g.5gb", -1}, {"1g..5gb", 0}, {strings.Repeat("1g", 30), 0}} {
		if name, err := PartitionDeviceName(0, bad.profile, bad.start); err == nil {
			t.Errorf("PartitionDeviceName(0, %q, %d) = %q, want an error", bad.profile, bad.start, name)
		}
	}
	if _, err := ParsePartitionParent("gpu-x-part-1g-at-0"); err == nil {
		t.Error("ParsePartitionParent accepted a parent that is no index")
	}
}
