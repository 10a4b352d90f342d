package discovery

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/driver/topology"
)

// onDemandMock is a simulated server with GPU 0 in MIG mode (with the
// layout's instances), its discoverer, instance manager and GPU 0's
// simulated device.
func onDemandMock(t *testing.T, name string, layout []string) (Discoverer, *MIGInstances, *server.Device) {
	t.Helper()
	d, err := NewMockWith(name, MockOptions{MIG: map[int][]string{0: layout}})
	if err != nil {
		t.Fatalf("NewMockWith: %v", err)
	}
	m, ok := MIGInstancesOf(d)
	if !ok {
		t.Fatal("MIGInstancesOf(mock) = false")
	}
	return d, m, d.(*nvmlDiscoverer).lib.(*server.Server).Devices[0].(*server.Device)
}

func discoverGPU(t *testing.T, d Discoverer, i int) topology.GPU {
	t.Helper()
	topo, err := d.Discover(context.Background())
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	return topo.GPUs[i]
}

func TestMIGInstancesCreateDestroy(t *testing.T) {
	for _, c := range []struct {
		server   string
		profile  string
		start    int
		conflict string // a profile at the same start that overlaps it
	}{
		{"dgxa100", "3g.20gb", 4, "1g.5gb"},
		{"dgxh100", "2g.20gb", 2, "1g.10gb"},
	} {
		t.Run(c.server, func(t *testing.T) {
			ctx := context.Background()
			d, m, _ := onDemandMock(t, c.server, nil)
			gpu := discoverGPU(t, d, 0)
			p, err := gpu.MIG.Partition(c.profile, c.start)
			if err != nil {
				t.Fatal(err)
			}
			in, err := m.Create(ctx, gpu.UUID, p)
			if err != nil {
				t.Fatalf("Create: %v", err)
			}
			if in.Placement != p.Placement || in.Profile.Name != c.profile || in.Profile.CISlices != p.Profile.GISlices || in.Profile.CIProfileID < 0 ||
				!strings.HasPrefix(in.UUID, "MIG-") || in.GICapMinor < 0 || in.CICapMinor < 0 {
				t.Errorf("Create = %+v, want a whole compute instance at %v with UUID and cap minors", in, p.Placement)
			}
			// Discovery sees the same instance.
			found := discoverGPU(t, d, 0).MIG.Instances
			if len(found) != 1 || found[0].UUID != in.UUID || found[0].GI != in.GI || found[0].CI != in.CI || found[0].GICapMinor != in.GICapMinor {
				t.Errorf("discovered %+v, want %+v", found, in)
			}
			// An overlapping placement is refused, and leaves nothing.
			q, err := gpu.MIG.Partition(c.conflict, c.start)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := m.Create(ctx, gpu.UUID, q); !errors.Is(err, nvml.ERROR_INSUFFICIENT_RESOURCES) {
				t.Errorf("Create of an overlapping %s: %v, want ERROR_INSUFFICIENT_RESOURCES", c.conflict, err)
			}
			gis, err := m.GPUInstances(ctx, gpu.UUID)
			if err != nil || len(gis) != 1 || gis[0].ComputeInstances != 1 || gis[0].Placement != p.Placement {
				t.Errorf("GPUInstances = %+v, %v; want the one instance", gis, err)
			}
			if err := m.Destroy(ctx, gpu.UUID, p.Profile.GIProfileID, p.Placement); err != nil {
				t.Fatalf("Destroy: %v", err)
			}
			if err := m.Destroy(ctx, gpu.UUID, p.Profile.GIProfileID, p.Placement); err != nil {
				t.Errorf("second Destroy: %v, want nil (idempotent)", err)
			}
			if gis, err := m.GPUInstances(ctx, gpu.UUID); err != nil || len(gis) != 0 {
				t.Errorf("GPUInstances after Destroy = %+v, %v; want none", gis, err)
			}
			// The placement is free again and the ID is reused.
			again, err := m.Create(ctx, gpu.UUID, q)
			if err != nil || again.GI != in.GI {
				t.Errorf("Create after Destroy = %+v, %v; want GPU instance ID %d again", again, err, in.GI)
			}
		})
	}
}

func TestMIGInstancesFailuresLeaveNothing(t *testing.T) {
	ctx := context.Background()
	d, m, dev := onDemandMock(t, "dgxa100", nil)
	gpu := discoverGPU(t, d, 0)
	p, err := gpu.MIG.Partition("2g.10gb", 2)
	if err != nil {
		t.Fatal(err)
	}
	// The compute instance cannot be created: the GPU instance goes again.
	create := dev.CreateGpuInstanceWithPlacementFunc
	dev.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, pl *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		gi, ret := create(info, pl)
		if ret == nvml.SUCCESS {
			gi.(*server.GpuInstance).CreateComputeInstanceFunc = func(*nvml.ComputeInstanceProfileInfo) (nvml.ComputeInstance, nvml.Return) {
				return nil, nvml.ERROR_UNKNOWN
			}
		}
		return gi, ret
	}
	if _, err := m.Create(ctx, gpu.UUID, p); !errors.Is(err, nvml.ERROR_UNKNOWN) || !strings.Contains(err.Error(), "CreateComputeInstance") {
		t.Errorf("Create with a failing compute instance: %v, want ERROR_UNKNOWN from CreateComputeInstance", err)
	}
	if gis, err := m.GPUInstances(ctx, gpu.UUID); err != nil || len(gis) != 0 {
		t.Errorf("GPUInstances after the failed Create = %+v, %v; want none", gis, err)
	}
	dev.CreateGpuInstanceWithPlacementFunc = create

	// A placement NVML does not list, a profile the model lacks.
	bad := p
	bad.Placement.Start = 1
	if _, err := m.Create(ctx, gpu.UUID, bad); !errors.Is(err, nvml.ERROR_INVALID_ARGUMENT) {
		t.Errorf("Create at an invalid placement: %v, want ERROR_INVALID_ARGUMENT", err)
	}
	bad = p
	bad.Profile.GIProfileID = 12
	if _, err := m.Create(ctx, gpu.UUID, bad); !errors.Is(err, nvml.ERROR_NOT_SUPPORTED) {
		t.Errorf("Create of a profile the A100 lacks: %v, want ERROR_NOT_SUPPORTED", err)
	}
	// A GPU instance with a compute instance left by someone else is
	// destroyed with it; one in use cannot be destroyed alone.
	if _, err := m.Create(ctx, gpu.UUID, p); err != nil {
		t.Fatal(err)
	}
	gi, err := findGPUInstanceOf(dev, p)
	if err != nil {
		t.Fatal(err)
	}
	if ret := gi.Destroy(); ret != nvml.ERROR_IN_USE {
		t.Errorf("GpuInstance.Destroy with a compute instance = %v, want ERROR_IN_USE", ret)
	}
	if err := m.Destroy(ctx, gpu.UUID, p.Profile.GIProfileID, p.Placement); err != nil {
		t.Errorf("Destroy: %v", err)
	}
	// A GPU not in MIG mode: gpulink never enables it.
	other := discoverGPU(t, d, 1)
	if _, err := m.Create(ctx, other.UUID, p); err == nil || !strings.Contains(err.Error(), "is not in MIG mode; gpulink never changes a GPU's MIG mode") {
		t.Errorf("Create on a GPU not in MIG mode: %v", err)
	}
	if err := m.Destroy(ctx, "GPU-unknown", p.Profile.GIProfileID, p.Placement); err == nil {
		t.Error("Destroy on an unknown GPU succeeded")
	}
}

func findGPUInstanceOf(dev *server.Device, p mig.Partition) (nvml.GpuInstance, error) {
	gi, err := findGPUInstance(dev, p.Profile.GIProfileID, p.Placement)
	if err == nil && gi == nil {
		err = errors.New("no GPU instance")
	}
	return gi, err
}
