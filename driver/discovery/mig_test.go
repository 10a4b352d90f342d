package discovery

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulink/gpulink/driver/mig"
)

func TestMockMIGDiscovery(t *testing.T) {
	d, err := NewMockWith("dgxa100", MockOptions{MIG: map[int][]string{
		0: {"1g.5gb", "3g.20gb", "1g.5gb"},
		1: {"7g.40gb"},
		2: {"1c.3g.20gb"},
	}})
	if err != nil {
		t.Fatalf("NewMockWith: %v", err)
	}
	topo, err := d.Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	type want struct {
		name          string
		gi, ci        int
		start, size   int
		mem           int64
		sms, giSlices int
		ciSlices      int
	}
	check := func(p int, wants []want) {
		t.Helper()
		g := topo.GPUs[p]
		if !g.MIGEnabled() {
			t.Fatalf("GPU %d: MIG not enabled: %+v", p, g.MIG)
		}
		if len(g.MIG.Instances) != len(wants) {
			t.Fatalf("GPU %d: %d instances, want %d: %+v", p, len(g.MIG.Instances), len(wants), g.MIG.Instances)
		}
		seen := map[string]bool{}
		for k, w := range wants {
			in := g.MIG.Instances[k]
			if in.Profile.Name != w.name || in.GI != w.gi || in.CI != w.ci || in.Placement != (mig.Placement{Start: w.start, Size: w.size}) ||
				in.Profile.MemoryBytes != w.mem || in.Profile.Multiprocessors != w.sms || in.Profile.GISlices != w.giSlices || in.Profile.CISlices != w.ciSlices {
				t.Errorf("GPU %d instance %d = %+v, want %+v", p, k, in, w)
			}
			if !strings.HasPrefix(in.UUID, "MIG-") || seen[in.UUID] {
				t.Errorf("GPU %d instance %d: UUID %q is not a fresh MIG UUID", p, k, in.UUID)
			}
			seen[in.UUID] = true
			// The driver's table: 3 + 135 per GPU minor + 9 per GPU instance.
			base := 3 + 135*g.Minor + 9*in.GI
			if in.GICapMinor != base || in.CICapMinor != base+1+in.CI {
				t.Errorf("GPU %d instance %d: cap minors %d, %d; want %d, %d", p, k, in.GICapMinor, in.CICapMinor, base, base+1+in.CI)
			}
		}
	}
	check(0, []want{
		{name: "1g.5gb", gi: 0, ci: 0, start: 0, size: 1, mem: 4864 << 20, sms: 14, giSlices: 1, ciSlices: 1},
		{name: "3g.20gb", gi: 1, ci: 0, start: 4, size: 4, mem: 19968 << 20, sms: 42, giSlices: 3, ciSlices: 3},
		{name: "1g.5gb", gi: 2, ci: 0, start: 1, size: 1, mem: 4864 << 20, sms: 14, giSlices: 1, ciSlices: 1},
	})
	check(1, []want{{name: "7g.40gb", gi: 0, ci: 0, start: 0, size: 8, mem: 40192 << 20, sms: 98, giSlices: 7, ciSlices: 7}})
	check(2, []want{{name: "1c.3g.20gb", gi: 0, ci: 0, start: 0, size: 4, mem: 19968 << 20, sms: 14, giSlices: 3, ciSlices: 1}})
	for p := 3; p < topo.Len(); p++ {
		if topo.GPUs[p].MIG != nil {
			t.Errorf("GPU %d is not in MIG mode but has MIG state %+v", p, topo.GPUs[p].MIG)
		}
	}
	// A second discovery sees the same instances and UUIDs.
	again, err := d.Discover(context.Background())
	if err != nil {
		t.Fatalf("second Discover: %v", err)
	}
	if a, b := again.GPUs[0].MIG.Instances[1].UUID, topo.GPUs[0].MIG.Instances[1].UUID; a != b {
		t.Errorf("MIG UUID changed between discoveries: %s, %s", a, b)
	}
}

func TestMockMIGLayoutErrors(t *testing.T) {
	for _, c := range []struct {
		layout map[int][]string
		want   string
	}{
		{map[int][]string{0: {"2g.7gb"}}, `GPU 0: profile "2g.7gb": unknown profile: the GPU has 1g.5gb`},
		{map[int][]string{1: {"4g.20gb", "4g.20gb"}}, `GPU 1: profile "4g.20gb": no free placement`},
		{map[int][]string{8: {"1g.5gb"}}, "GPU 8: the server has GPUs 0..7"},
		{map[int][]string{0: {"0c.3g.20gb"}}, `compute instance slices "0"`},
	} {
		_, err := NewMockWith("dgxa100", MockOptions{MIG: c.layout})
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("layout %v: got %v, want an error containing %q", c.layout, err, c.want)
		}
	}
}

func TestParseMockMIG(t *testing.T) {
	got, err := ParseMockMIG("0:1g.5gb,3g.20gb; 3:7g.40gb")
	if err != nil {
		t.Fatalf("ParseMockMIG: %v", err)
	}
	if len(got) != 2 || strings.Join(got[0], "+") != "1g.5gb+3g.20gb" || strings.Join(got[3], "+") != "7g.40gb" {
		t.Errorf("ParseMockMIG = %v", got)
	}
	// "0:": MIG mode without instances, for MIG on demand.
	if got, err := ParseMockMIG("0:;1:7g.40gb"); err != nil || len(got) != 2 || got[0] != nil || len(got[1]) != 1 {
		t.Errorf("ParseMockMIG(\"0:;1:7g.40gb\") = %v, %v; want GPU 0 without instances, GPU 1 with one", got, err)
	}
	if got, err := ParseMockMIG(""); err != nil || len(got) != 0 {
		t.Errorf("ParseMockMIG(\"\") = %v, %v; want empty", got, err)
	}
	for _, bad := range []string{"1g.5gb", "x:1g.5gb", "-1:1g.5gb", "0:1g.5gb;0:3g.20gb", "0:;0:", "0:1g.5gb,,3g.20gb"} {
		if _, err := ParseMockMIG(bad); err == nil {
			t.Errorf("ParseMockMIG(%q) accepted it", bad)
		}
	}
}

// A failing MIG call aborts discovery naming the GPU and the call; a GPU
// that cannot do MIG is a whole GPU.
func TestMIGModeErrors(t *testing.T) {
	box := fakeBox{gpus: []fakeGPU{{busID: nvBus(7)}, {busID: nvBus(8)}}, ancestor: func(i, j int) nvml.GpuTopologyLevel { return nvml.TOPOLOGY_SYSTEM }}
	lib, devs := box.build()
	topo, err := newNVML(lib, fstest.MapFS{}).Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if topo.GPUs[0].MIG != nil {
		t.Errorf("GPU without MIG support has MIG state %+v", topo.GPUs[0].MIG)
	}
	devs[1].GetMigModeFunc = func() (int, int, nvml.Return) { return 0, 0, nvml.ERROR_UNKNOWN }
	_, err = newNVML(lib, fstest.MapFS{}).Discover(context.Background())
	if !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "GPU 1: GetMigMode") {
		t.Errorf("GetMigMode failing: got %v, want an error naming GPU 1 and GetMigMode", err)
	}
}

func TestParseMIGCaps(t *testing.T) {
	caps, err := parseMIGCaps([]byte("config 1\nmonitor 2\ngpu0/gi0/access 3\n\ngpu0/gi0/ci0/access 4\n"))
	if err != nil {
		t.Fatalf("parseMIGCaps: %v", err)
	}
	if caps.lookup("gpu0/gi0/ci0/access") != 4 || caps.lookup("gpu1/gi0/access") != -1 {
		t.Errorf("caps = %v", caps)
	}
	if _, err := parseMIGCaps([]byte("gpu0/gi0/access three\n")); err == nil || !strings.Contains(err.Error(), "line 1") {
		t.Errorf("malformed line: got %v, want an error naming line 1", err)
	}
	if caps, err := readMIGCaps(fstest.MapFS{}); err != nil || len(caps) != 0 {
		t.Errorf("missing table: %v, %v; want an empty table", caps, err)
	}
}
