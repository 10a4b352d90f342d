package discovery

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulink/gpulink/driver/mig"
)

// MIGInstances creates and destroys the GPU and compute instances of MIG
// on demand through NVML. It never changes a GPU's MIG mode: a GPU that is
// not in MIG mode is an error. Like Discover, each call initializes NVML
// and shuts it down again.
type MIGInstances struct {
	lib nvml.Interface
	// proc is procfs, for the capability table (mig.go).
	proc fs.FS
}

// NewMIGInstances returns the instance manager of lib (nil: the real
// library), reading cap minors from the host's procfs.
func NewMIGInstances(lib nvml.Interface) *MIGInstances {
	if lib == nil {
		lib = nvml.New()
	}
	return &MIGInstances{lib: lib, proc: os.DirFS(hostProcRoot)}
}

// MIGInstancesOf returns the instance manager over the same NVML library
// (real or simulated) as a Discoverer of NewNVML or NewMock; false for
// other discoverers (a topology file has no instances to create).
func MIGInstancesOf(d Discoverer) (*MIGInstances, bool) {
	n, ok := d.(*nvmlDiscoverer)
	if !ok {
		return nil, false
	}
	return &MIGInstances{lib: n.lib, proc: n.proc}, true
}

// GPUInstance is a GPU instance as NVML lists it, whether or not it has
// compute instances (one left half created or half destroyed has none).
type GPUInstance struct {
	ProfileID int
	ID        int
	Placement mig.Placement
	// ComputeInstances counts its compute instances.
	ComputeInstances int
}

// withGPU runs fn with NVML initialized and the handle of the GPU of
// parentUUID, which must be in MIG mode.
func (m *MIGInstances) withGPU(ctx context.Context, parentUUID string, fn func(h nvml.Device) error) (err error) {
	if err := ctx.Err(); err != nil {
		return err
	}
	if ret := m.lib.Init(); ret != nvml.SUCCESS {
		return initError(ret)
	}
	defer func() {
		if ret := m.lib.Shutdown(); ret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("shut down NVML: %w", ret))
		}
	}()
	h, ret := m.lib.DeviceGetHandleByUUID(parentUUID)
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: DeviceGetHandleByUUID: %w", parentUUID, ret)
	}
	current, _, ret := h.GetMigMode()
	if ret != nvml.SUCCESS {
		return fmt.Errorf("GPU %s: GetMigMode: %w", parentUUID, ret)
	}
	if current != nvml.DEVICE_MIG_ENABLE {
		return fmt.Errorf("GPU %s is not in MIG mode; gpulink never changes a GPU's MIG mode", parentUUID)
	}
	return fn(h)
}

// Create creates a GPU instance of the partition's profile at its
// placement on the GPU of parentUUID and one compute instance over all of
// it, and returns the instance as discovery reads it (UUID and cap minors
// included). A failure leaves nothing behind: a GPU instance whose compute
// instance cannot be created, or whose MIG device NVML does not list, is
// destroyed again.
func (m *MIGInstances) Create(ctx context.Context, parentUUID string, p mig.Partition) (mig.Instance, error) {
	// Read before anything is created: a table that cannot be read
	// fails the call with nothing to undo.
	caps, err := readMIGCaps(m.proc)
	if err != nil {
		return mig.Instance{}, err
	}
	var out mig.Instance
	err = m.withGPU(ctx, parentUUID, func(h nvml.Device) error {
		info, ret := h.GetGpuInstanceProfileInfo(p.Profile.GIProfileID)
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %s: profile %s: GetGpuInstanceProfileInfo(%d): %w", parentUUID, p.Profile.Name, p.Profile.GIProfileID, ret)
		}
		gi, ret := h.CreateGpuInstanceWithPlacement(&info, &nvml.GpuInstancePlacement{Start: uint32(p.Placement.Start), Size: uint32(p.Placement.Size)})
		if ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %s: creating GPU instance %s at memory slice %d: CreateGpuInstanceWithPlacement: %w", parentUUID, p.Profile.Name, p.Placement.Start, ret)
		}
		in, err := createComputeInstance(h, gi, info, p, caps)
		if err != nil {
			if ret := destroyGPUInstance(gi); ret != nvml.SUCCESS {
				err = errors.Join(err, fmt.Errorf("destroying the GPU instance again: %w", ret))
			}
			return fmt.Errorf("GPU %s: %s at memory slice %d: %w", parentUUID, p.Profile.Name, p.Placement.Start, err)
		}
		out = in
		return nil
	})
	return out, err
}

// createComputeInstance creates the compute instance over all of gi and
// reads the MIG device back.
func createComputeInstance(h nvml.Device, gi nvml.GpuInstance, giProfile nvml.GpuInstanceProfileInfo, p mig.Partition, caps migCaps) (mig.Instance, error) {
	var ciProfile nvml.ComputeInstanceProfileInfo
	found := false
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret == nvml.SUCCESS && info.SliceCount == giProfile.SliceCount {
			ciProfile, found = info, true
			break
		}
	}
	if !found {
		return mig.Instance{}, fmt.Errorf("no compute instance profile takes all %d compute slices of the GPU instance", giProfile.SliceCount)
	}
	ci, ret := gi.CreateComputeInstance(&ciProfile)
	if ret != nvml.SUCCESS {
		return mig.Instance{}, fmt.Errorf("CreateComputeInstance: %w", ret)
	}
	in, err := readCreated(h, gi, ci, p, ciProfile, caps)
	if err != nil {
		if ret := ci.Destroy(); ret != nvml.SUCCESS {
			err = errors.Join(err, fmt.Errorf("destroying the compute instance again: %w", ret))
		}
		return mig.Instance{}, err
	}
	return in, nil
}

// readCreated reads a new instance's IDs, MIG device UUID and cap minors.
func readCreated(h nvml.Device, gi nvml.GpuInstance, ci nvml.ComputeInstance, p mig.Partition, ciProfile nvml.ComputeInstanceProfileInfo, caps migCaps) (mig.Instance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return mig.Instance{}, fmt.Errorf("GpuInstance.GetInfo: %w", ret)
	}
	ciInfo, ret := ci.GetInfo()
	if ret != nvml.SUCCESS {
		return mig.Instance{}, fmt.Errorf("ComputeInstance.GetInfo: %w", ret)
	}
	index, ret := h.GetIndex()
	if ret != nvml.SUCCESS {
		return mig.Instance{}, fmt.Errorf("GetIndex: %w", ret)
	}
	minor, ret := h.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return mig.Instance{}, fmt.Errorf("GetMinorNumber: %w", ret)
	}
	uuids, err := migUUIDs(index, h)
	if err != nil {
		return mig.Instance{}, err
	}
	giID, ciID := int(giInfo.Id), int(ciInfo.Id)
	uuid := uuids[[2]int{giID, ciID}]
	if uuid == "" {
		// Without it a container could only be given the whole parent.
		return mig.Instance{}, fmt.Errorf("NVML lists no MIG device for GPU instance %d, compute instance %d", giID, ciID)
	}
	prof := p.Profile
	prof.CIProfileID = int(ciProfile.Id)
	prof.CISlices = int(ciProfile.SliceCount)
	if ciProfile.MultiprocessorCount > 0 {
		prof.Multiprocessors = int(ciProfile.MultiprocessorCount)
	}
	return mig.Instance{
		Profile:    prof,
		GI:         giID,
		CI:         ciID,
		Placement:  mig.Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
		UUID:       uuid,
		GICapMinor: caps.lookup(fmt.Sprintf("gpu%d/gi%d/access", minor, giID)),
		CICapMinor: caps.lookup(fmt.Sprintf("gpu%d/gi%d/ci%d/access", minor, giID, ciID)),
	}, nil
}

// Destroy destroys the GPU instance of profile giProfileID at the
// placement on the GPU of parentUUID, its compute instances first. An
// instance that does not exist is no error: Destroy is idempotent, and a
// retry after a partial failure finishes the job.
func (m *MIGInstances) Destroy(ctx context.Context, parentUUID string, giProfileID int, pl mig.Placement) error {
	return m.withGPU(ctx, parentUUID, func(h nvml.Device) error {
		gi, err := findGPUInstance(h, giProfileID, pl)
		if err != nil || gi == nil {
			return err
		}
		cis, err := computeInstances(gi)
		if err != nil {
			return err
		}
		for _, ci := range cis {
			if ret := ci.Destroy(); ret != nvml.SUCCESS {
				return fmt.Errorf("GPU %s: destroying a compute instance of GPU instance at memory slice %d: %w", parentUUID, pl.Start, ret)
			}
		}
		if ret := destroyGPUInstance(gi); ret != nvml.SUCCESS {
			return fmt.Errorf("GPU %s: destroying GPU instance (profile %d) at memory slice %d: %w", parentUUID, giProfileID, pl.Start, ret)
		}
		return nil
	})
}

// GPUInstances lists the GPU instances of the GPU of parentUUID, with
// their compute instance counts.
func (m *MIGInstances) GPUInstances(ctx context.Context, parentUUID string) ([]GPUInstance, error) {
	var out []GPUInstance
	err := m.withGPU(ctx, parentUUID, func(h nvml.Device) error {
		for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
			info, ret := h.GetGpuInstanceProfileInfo(id)
			if absentProfile(ret) {
				continue
			}
			if ret != nvml.SUCCESS {
				return fmt.Errorf("GPU %s: GetGpuInstanceProfileInfo(%d): %w", parentUUID, id, ret)
			}
			gis, ret := h.GetGpuInstances(&info)
			if absentProfile(ret) {
				continue
			}
			if ret != nvml.SUCCESS {
				return fmt.Errorf("GPU %s: GetGpuInstances(profile %d): %w", parentUUID, id, ret)
			}
			for _, gi := range gis {
				giInfo, ret := gi.GetInfo()
				if ret != nvml.SUCCESS {
					return fmt.Errorf("GPU %s: GpuInstance.GetInfo: %w", parentUUID, ret)
				}
				cis, err := computeInstances(gi)
				if err != nil {
					return fmt.Errorf("GPU %s: %w", parentUUID, err)
				}
				out = append(out, GPUInstance{
					ProfileID:        id,
					ID:               int(giInfo.Id),
					Placement:        mig.Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
					ComputeInstances: len(cis),
				})
			}
		}
		return nil
	})
	return out, err
}

// findGPUInstance returns the GPU instance of a profile at a placement,
// nil when there is none.
func findGPUInstance(h nvml.Device, giProfileID int, pl mig.Placement) (nvml.GpuInstance, error) {
	info, ret := h.GetGpuInstanceProfileInfo(giProfileID)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetGpuInstanceProfileInfo(%d): %w", giProfileID, ret)
	}
	gis, ret := h.GetGpuInstances(&info)
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("GetGpuInstances(profile %d): %w", giProfileID, ret)
	}
	for _, gi := range gis {
		giInfo, ret := gi.GetInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GpuInstance.GetInfo: %w", ret)
		}
		if int(giInfo.Placement.Start) == pl.Start && int(giInfo.Placement.Size) == pl.Size {
			return gi, nil
		}
	}
	return nil, nil
}

// computeInstances lists all compute instances of a GPU instance.
func computeInstances(gi nvml.GpuInstance) ([]nvml.ComputeInstance, error) {
	var out []nvml.ComputeInstance
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if absentProfile(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GetComputeInstanceProfileInfo(%d): %w", id, ret)
		}
		cis, ret := gi.GetComputeInstances(&info)
		if absentProfile(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("GetComputeInstances(profile %d): %w", id, ret)
		}
		out = append(out, cis...)
	}
	return out, nil
}

func destroyGPUInstance(gi nvml.GpuInstance) nvml.Return { return gi.Destroy() }

// MockLibrary returns the simulated NVML library behind a Discoverer of
// NewMock or NewMockWith, so that tests and simulations can change the
// simulated GPUs as an operator's tools would; false for other
// discoverers.
func MockLibrary(d Discoverer) (nvml.Interface, bool) {
	n, ok := d.(*nvmlDiscoverer)
	if !ok {
		return nil, false
	}
	s, ok := n.lib.(*server.Server)
	return s, ok
}
