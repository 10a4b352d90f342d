package discovery

import (
	"fmt"
	"testing"
)

func TestArchFromComputeCapability(t *testing.T) {
	tests := []struct {
		major, minor int
		want         string
	}{
		{3, 7, "kepler"},
		{5, 2, "maxwell"},
		{6, 1, "pascal"},
		{7, 0, "volta"},
		{7, 2, "volta"},
		{7, 5, "turing"},
		{8, 0, "ampere"},
		{8, 6, "ampere"},
		{8, 7, "ampere"},
		{8, 9, "ada"},
		{9, 0, "hopper"},
		{10, 0, "blackwell"},
		{12, 0, "blackwell"},
		{2, 1, ""},
		{13, 0, ""},
	}
	for _, tc := range tests {
		t.Run(fmt.Sprintf("%d.%d", tc.major, tc.minor), func(t *testing.T) {
			if got := archFromComputeCapability(tc.major, tc.minor); got != tc.want {
				t.Errorf("archFromComputeCapability(%d, %d) = %q, want %q", tc.major, tc.minor, got, tc.want)
			}
		})
	}
}

// TestDerivedArchitecturesAreKnown keeps the fallback and the NVML map in
// step: every name the fallback produces must be one NVML discovery uses.
func TestDerivedArchitecturesAreKnown(t *testing.T) {
	for major := range 16 {
		for minor := range 10 {
			if a := archFromComputeCapability(major, minor); a != "" && !knownArchitecture(a) {
				t.Errorf("compute capability %d.%d maps to %q, which archNames lacks", major, minor, a)
			}
		}
	}
}
