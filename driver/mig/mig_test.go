package mig

import "testing"

// The names nvidia-smi prints for the profiles of the go-nvml mocks'
// A100 40GB and H100 80GB (profile memory in MiB as NVML reports it).
func TestGIProfileName(t *testing.T) {
	const a100, h100 = 40960 << 20, 81920 << 20
	for _, c := range []struct {
		id, slices int
		mib        uint64
		gpu        int64
		want       string
	}{
		{0, 1, 4864, a100, "1g.5gb"},
		{7, 1, 4864, a100, "1g.5gb+me"},
		{9, 1, 9856, a100, "1g.10gb"},
		{1, 2, 9856, a100, "2g.10gb"},
		{2, 3, 19968, a100, "3g.20gb"},
		{3, 4, 19968, a100, "4g.20gb"},
		{4, 7, 40192, a100, "7g.40gb"},
		{0, 1, 10240, h100, "1g.10gb"},
		{9, 1, 20480, h100, "1g.20gb"},
		{2, 3, 40960, h100, "3g.40gb"},
		{4, 7, 81920, h100, "7g.80gb"},
	} {
		got, err := GIProfileName(c.id, c.slices, c.mib, c.gpu)
		if err != nil || got != c.want {
			t.Errorf("GIProfileName(%d, %d, %d, %d) = %q, %v; want %q", c.id, c.slices, c.mib, c.gpu, got, err, c.want)
		}
	}
}

func TestGIProfileNameRejects(t *testing.T) {
	for _, c := range []struct {
		slices int
		mib    uint64
		gpu    int64
	}{{0, 4864, 40 << 30}, {1, 4864, 0}, {1, 0, 40 << 30}, {1, 50000, 40 << 30}} {
		if got, err := GIProfileName(0, c.slices, c.mib, c.gpu); err == nil {
			t.Errorf("GIProfileName(0, %d, %d, %d) = %q, want an error", c.slices, c.mib, c.gpu, got)
		}
	}
}

func TestProfileName(t *testing.T) {
	if got := ProfileName("3g.20gb", 3, 3); got != "3g.20gb" {
		t.Errorf("whole GPU instance: %q", got)
	}
	if got := ProfileName("3g.20gb", 3, 1); got != "1c.3g.20gb" {
		t.Errorf("1 of 3 slices: %q, want 1c.3g.20gb", got)
	}
}

func TestPlacementOverlaps(t *testing.T) {
	a, b, c := Placement{0, 4}, Placement{4, 4}, Placement{2, 2}
	if a.Overlaps(b) || b.Overlaps(a) {
		t.Error("adjacent placements overlap")
	}
	if !a.Overlaps(c) || !c.Overlaps(a) {
		t.Error("nested placements do not overlap")
	}
}
