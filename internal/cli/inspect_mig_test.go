package cli

import (
	"context"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver/discovery"
)

// inspect shows a node's MIG layout (device, parent GPU, profile, memory
// slices) and who holds each MIG device, and counts them in the node's
// summary; held MIG devices are not "not published".
func TestInspectMIG(t *testing.T) {
	d, err := discovery.NewMockWith("dgxa100", discovery.MockOptions{MIG: map[int][]string{0: {"1g.5gb", "3g.20gb"}, 1: {"7g.40gb"}}})
	if err != nil {
		t.Fatal(err)
	}
	topo, err := d.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s, err := controllertest.Slice("a100", topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	newClient, _ := fakeClient(s, heldClaim("team", "small", []string{"p"}, wholeGPU("a100", "gpu-0-mig-0-0")))
	out, _, err := runInspectCmd(t, newClient)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"NODE a100: 6 GPUs, 6 free, 0 shared, 0 held whole; 2 GPUs in MIG mode, 3 MIG devices, 2 free",
		"MIG DEVICE",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	rows := map[string][]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 && strings.Contains(f[0], "-mig-") {
			rows[f[0]] = f
		}
	}
	for dev, want := range map[string]string{
		"gpu-0-mig-0-0": "gpu-0-mig-0-0 gpu-0 1g.5gb 0 4864Mi no team/small pods/p",
		"gpu-0-mig-1-0": "gpu-0-mig-1-0 gpu-0 3g.20gb 4-7 19968Mi yes - -",
		"gpu-1-mig-0-0": "gpu-1-mig-0-0 gpu-1 7g.40gb 0-7 40192Mi yes - -",
	} {
		if got := strings.Join(rows[dev], " "); got != want {
			t.Errorf("row %q, want %q", got, want)
		}
	}
	if strings.Contains(out, "not published") {
		t.Errorf("a held MIG device is shown as not published:\n%s", out)
	}
}

// explain names a pod's MIG devices by profile and parent GPU.
func TestExplainMIGPod(t *testing.T) {
	d, err := discovery.NewMockWith("dgxa100", discovery.MockOptions{MIG: map[int][]string{0: {"1g.5gb", "3g.20gb"}}})
	if err != nil {
		t.Fatal(err)
	}
	topo, err := d.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	s, err := controllertest.Slice("a100", topo, controllertest.SliceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	claim := heldClaim("team-a", "mig", nil, wholeGPU("a100", "gpu-0-mig-0-0"), wholeGPU("a100", "gpu-0-mig-1-0"))
	out, err := runExplain(t, []runtime.Object{s, claim, podWithClaim("trainer", "mig", false, "a100")}, "trainer")
	if err != nil {
		t.Fatalf("explain failed: %v\n%s", err, out)
	}
	if want := "    request gpus: gpu-0-mig-0-0, gpu-0-mig-1-0 (MIG device 1g.5gb of gpu-0, MIG device 3g.20gb of gpu-0)"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}

// inspect shows the layout of GPUs partitioned on demand: per GPU its free
// memory slices and the largest instances still possible, and the held
// partitions with their claims.
func TestInspectOnDemand(t *testing.T) {
	objects := []runtime.Object{heldClaim("team", "small", []string{"p"}, wholeGPU("a100", "gpu-0-part-1g-5gb-at-6"))}
	for _, s := range controllertest.OnDemandSlices(t, "dgxa100", "a100", map[int][]string{0: nil, 1: nil}, 0, 1) {
		objects = append(objects, s)
	}
	newClient, _ := fakeClient(objects...)
	out, _, err := runInspectCmd(t, newClient)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"NODE a100: 6 GPUs, 6 free, 0 shared, 0 held whole; 2 GPUs partitioned on demand, 1 partitions held",
		"ON-DEMAND GPU",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	rows := map[string]string{}
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			rows[f[0]] = strings.Join(f, " ")
		}
	}
	for dev, want := range map[string]string{
		"gpu-0":                  "gpu-0 0-5,7 of 8 a 4g, a 3g, 3 2g, 6 1g",
		"gpu-1":                  "gpu-1 0-7 of 8 a 7g, a 4g, 2 3g, 3 2g, 7 1g",
		"gpu-0-part-1g-5gb-at-6": "gpu-0-part-1g-5gb-at-6 gpu-0 1g.5gb 6 4864Mi no team/small pods/p",
	} {
		if got := rows[dev]; got != want {
			t.Errorf("row %q, want %q\n%s", got, want, out)
		}
	}
	if strings.Contains(out, "not published") {
		t.Errorf("a held partition is shown as not published:\n%s", out)
	}
}

// explain names a pod's partitions by profile, placement and GPU.
func TestExplainOnDemandPod(t *testing.T) {
	objects := []runtime.Object{heldClaim("team-a", "mig", nil, wholeGPU("a100", "gpu-1-part-3g-20gb-at-4")), podWithClaim("trainer", "mig", false, "a100")}
	for _, s := range controllertest.OnDemandSlices(t, "dgxa100", "a100", map[int][]string{0: nil, 1: nil}, 0, 1) {
		objects = append(objects, s)
	}
	out, err := runExplain(t, objects, "trainer")
	if err != nil {
		t.Fatalf("explain failed: %v\n%s", err, out)
	}
	if want := "    request gpus: gpu-1-part-3g-20gb-at-4 (partition 3g.20gb at memory slice 4 of gpu-1)"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q:\n%s", want, out)
	}
}
