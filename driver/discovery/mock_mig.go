package discovery

import (
	"crypto/sha256"
	"fmt"
	"io/fs"
	"slices"
	"strconv"
	"strings"
	"testing/fstest"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"

	"github.com/gpulink/gpulink/driver/mig"
)

// MockOptions configure NewMockWith.
type MockOptions struct {
	// MIG puts the GPUs with these indexes in MIG mode and creates, in
	// the order given, a GPU instance of each named profile at its first
	// free placement with one compute instance: the whole GPU instance,
	// or <n> of its slices for a name "<n>c.<GPU instance profile>".
	MIG map[int][]string
	// Fabric, when set, is the NVLink fabric info every GPU reports
	// (GetGpuFabricInfo), as the GPUs of a GB200 NVL72 tray do: a
	// completed registration puts them in its cluster's clique. Nil: no
	// fabric (ERROR_NOT_SUPPORTED), as a DGX reports.
	Fabric *nvml.GpuFabricInfo
}

// ParseMockMIG parses the --mock-mig flag: GPUs separated by ";", each
// "<index>:<profile>,<profile>,...", e.g. "0:1g.5gb,3g.20gb;1:7g.40gb".
// "<index>:" puts a GPU in MIG mode without instances (a GPU to partition
// on demand).
func ParseMockMIG(s string) (map[int][]string, error) {
	out := map[int][]string{}
	if strings.TrimSpace(s) == "" {
		return out, nil
	}
	for _, part := range strings.Split(s, ";") {
		idxText, profiles, ok := strings.Cut(strings.TrimSpace(part), ":")
		idx, err := strconv.Atoi(idxText)
		if !ok || err != nil || idx < 0 {
			return nil, fmt.Errorf("%q: want <GPU index>:<profile>[,<profile>...]", part)
		}
		if _, dup := out[idx]; dup {
			return nil, fmt.Errorf("%q: GPU %d is listed twice", part, idx)
		}
		if strings.TrimSpace(profiles) == "" {
			out[idx] = nil
			continue
		}
		names := strings.Split(profiles, ",")
		for _, n := range names {
			if strings.TrimSpace(n) == "" {
				return nil, fmt.Errorf("%q: empty profile name", part)
			}
		}
		out[idx] = names
	}
	return out, nil
}

// createMockMIG sets up opts.MIG on a mock server through NVML calls, as
// an operator's nvidia-smi mig would.
func createMockMIG(s *server.Server, layout map[int][]string) error {
	for idx, profiles := range layout {
		if idx >= len(s.Devices) {
			return fmt.Errorf("MIG layout: GPU %d: the server has GPUs 0..%d", idx, len(s.Devices)-1)
		}
		dev := s.Devices[idx].(*server.Device)
		if ret, _ := dev.SetMigMode(nvml.DEVICE_MIG_ENABLE); ret != nvml.SUCCESS {
			return fmt.Errorf("MIG layout: GPU %d: SetMigMode: %w", idx, ret)
		}
		var taken []mig.Placement
		for _, name := range profiles {
			p, err := createMockInstance(dev, name, taken)
			if err != nil {
				return fmt.Errorf("MIG layout: GPU %d: profile %q: %w", idx, name, err)
			}
			taken = append(taken, p)
		}
	}
	return nil
}

// createMockInstance creates one GPU instance and its compute instance.
func createMockInstance(dev *server.Device, name string, taken []mig.Placement) (mig.Placement, error) {
	giName, ciSlices := name, 0
	if c, rest, ok := strings.Cut(name, "c."); ok {
		n, err := strconv.Atoi(c)
		if err != nil || n <= 0 {
			return mig.Placement{}, fmt.Errorf("compute instance slices %q: want a positive number", c)
		}
		giName, ciSlices = rest, n
	}
	var known []string
	for id := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := dev.GetGpuInstanceProfileInfo(id)
		if ret != nvml.SUCCESS {
			continue
		}
		n, err := mig.GIProfileName(id, int(info.SliceCount), info.MemorySizeMB, int64(dev.MemoryInfo.Total))
		if err != nil {
			return mig.Placement{}, err
		}
		known = append(known, n)
		if n != giName {
			continue
		}
		placements, ret := dev.GetGpuInstancePossiblePlacements(&info)
		if ret != nvml.SUCCESS {
			return mig.Placement{}, fmt.Errorf("GetGpuInstancePossiblePlacements: %w", ret)
		}
		for _, pl := range placements {
			p := mig.Placement{Start: int(pl.Start), Size: int(pl.Size)}
			if slices.ContainsFunc(taken, p.Overlaps) {
				continue
			}
			gi, ret := dev.CreateGpuInstanceWithPlacement(&info, &pl)
			if ret != nvml.SUCCESS {
				return mig.Placement{}, fmt.Errorf("CreateGpuInstanceWithPlacement: %w", ret)
			}
			if ciSlices == 0 {
				ciSlices = int(info.SliceCount)
			}
			return p, createMockComputeInstance(gi, ciSlices)
		}
		return mig.Placement{}, fmt.Errorf("no free placement left (taken: %v)", taken)
	}
	return mig.Placement{}, fmt.Errorf("unknown profile: the GPU has %s", strings.Join(known, ", "))
}

func createMockComputeInstance(gi nvml.GpuInstance, slices int) error {
	for id := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		info, ret := gi.GetComputeInstanceProfileInfo(id, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if ret != nvml.SUCCESS || int(info.SliceCount) != slices {
			continue
		}
		if _, ret := gi.CreateComputeInstance(&info); ret != nvml.SUCCESS {
			return fmt.Errorf("CreateComputeInstance: %w", ret)
		}
		return nil
	}
	return fmt.Errorf("no compute instance profile of %d slices in this GPU instance", slices)
}

// installMIGHandles answers the MIG device handle calls the go-nvml
// servers leave unset, from the device's GPU and compute instances: slots
// 0..maxMIGDevices-1, filled in (GI, CI) order, with a UUID that is
// stable per parent and instance.
func installMIGHandles(dev *server.Device) {
	const maxMIGDevices = 7 // A100, H100, H200, B200
	if dev.GetMaxMigDeviceCountFunc == nil {
		dev.GetMaxMigDeviceCountFunc = func() (int, nvml.Return) { return maxMIGDevices, nvml.SUCCESS }
	}
	if dev.GetMigDeviceHandleByIndexFunc != nil {
		return
	}
	dev.GetMigDeviceHandleByIndexFunc = func(k int) (nvml.Device, nvml.Return) {
		if k < 0 || k >= maxMIGDevices {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		ids := mockInstanceIDs(dev)
		if k >= len(ids) {
			return nil, nvml.ERROR_NOT_FOUND
		}
		gi, ci := ids[k][0], ids[k][1]
		sum := sha256.Sum256([]byte(fmt.Sprintf("%s/%d/%d", dev.UUID, gi, ci)))
		uuid := fmt.Sprintf("MIG-%x-%x-%x-%x-%x", sum[0:4], sum[4:6], sum[6:8], sum[8:10], sum[10:16])
		return &mock.Device{
			GetGpuInstanceIdFunc:     func() (int, nvml.Return) { return gi, nvml.SUCCESS },
			GetComputeInstanceIdFunc: func() (int, nvml.Return) { return ci, nvml.SUCCESS },
			GetUUIDFunc:              func() (string, nvml.Return) { return uuid, nvml.SUCCESS },
		}, nvml.SUCCESS
	}
}

// installMIGInstances makes the mock's GPU instances behave as NVML's
// do, where the go-nvml servers simply record what is asked: a GPU
// instance goes only at a placement NVML lists for its profile, where no
// other instance overlaps and while the profile's instance count allows;
// it gets the lowest free ID (so the driver's capability table has its
// minors); it can be found by ID; and it cannot be destroyed while it has
// compute instances. MIG on demand's create and destroy run against it.
func installMIGInstances(dev *server.Device) {
	dev.CreateGpuInstanceWithPlacementFunc = func(info *nvml.GpuInstanceProfileInfo, placement *nvml.GpuInstancePlacement) (nvml.GpuInstance, nvml.Return) {
		dev.Lock()
		defer dev.Unlock()
		if dev.MigMode != nvml.DEVICE_MIG_ENABLE {
			return nil, nvml.ERROR_NOT_SUPPORTED
		}
		if !slices.Contains(dev.Config.MIGProfiles.GpuInstancePlacements[int(info.Id)], *placement) {
			return nil, nvml.ERROR_INVALID_ARGUMENT
		}
		want := mig.Placement{Start: int(placement.Start), Size: int(placement.Size)}
		used := map[uint32]bool{}
		sameProfile := 0
		for gi := range dev.GpuInstances {
			used[gi.Info.Id] = true
			if gi.Info.ProfileId == info.Id {
				sameProfile++
			}
			if want.Overlaps(mig.Placement{Start: int(gi.Info.Placement.Start), Size: int(gi.Info.Placement.Size)}) {
				return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
			}
		}
		if info.InstanceCount > 0 && sameProfile >= int(info.InstanceCount) {
			return nil, nvml.ERROR_INSUFFICIENT_RESOURCES
		}
		id := uint32(0)
		for used[id] {
			id++
		}
		gi := server.NewGpuInstanceFromInfo(nvml.GpuInstanceInfo{Device: dev, Id: id, ProfileId: info.Id, Placement: *placement}, dev.Config.MIGProfiles)
		gi.DestroyFunc = func() nvml.Return {
			gi.RLock()
			inUse := len(gi.ComputeInstances) > 0
			gi.RUnlock()
			if inUse {
				return nvml.ERROR_IN_USE
			}
			dev.Lock()
			defer dev.Unlock()
			if _, ok := dev.GpuInstances[gi]; !ok {
				return nvml.ERROR_NOT_FOUND
			}
			delete(dev.GpuInstances, gi)
			return nvml.SUCCESS
		}
		dev.GpuInstances[gi] = struct{}{}
		return gi, nvml.SUCCESS
	}
	dev.GetGpuInstanceByIdFunc = func(id int) (nvml.GpuInstance, nvml.Return) {
		dev.RLock()
		defer dev.RUnlock()
		for gi := range dev.GpuInstances {
			if int(gi.Info.Id) == id {
				return gi, nvml.SUCCESS
			}
		}
		return nil, nvml.ERROR_NOT_FOUND
	}
}

// mockInstanceIDs lists a mock device's (GI, CI) pairs in order.
func mockInstanceIDs(dev *server.Device) [][2]int {
	dev.RLock()
	gis := make([]*server.GpuInstance, 0, len(dev.GpuInstances))
	for gi := range dev.GpuInstances {
		gis = append(gis, gi)
	}
	dev.RUnlock()
	var ids [][2]int
	for _, gi := range gis {
		gi.RLock()
		for ci := range gi.ComputeInstances {
			ids = append(ids, [2]int{int(gi.Info.Id), int(ci.Info.Id)})
		}
		gi.RUnlock()
	}
	slices.SortFunc(ids, func(a, b [2]int) int {
		if a[0] != b[0] {
			return a[0] - b[0]
		}
		return a[1] - b[1]
	})
	return ids
}

// mockProc is the procfs of a simulated machine: the driver's MIG
// capability table for GPU minors 0..gpus-1, laid out as the driver lays
// it out (15 GPU instances of 8 compute instances per GPU, each GPU
// instance's access minor followed by its compute instances').
func mockProc(gpus int) fs.FS {
	var b strings.Builder
	b.WriteString("config 1\nmonitor 2\n")
	minor := 3
	for g := range gpus {
		for gi := range 15 {
			fmt.Fprintf(&b, "gpu%d/gi%d/access %d\n", g, gi, minor)
			minor++
			for ci := range 8 {
				fmt.Fprintf(&b, "gpu%d/gi%d/ci%d/access %d\n", g, gi, ci, minor)
				minor++
			}
		}
	}
	return fstest.MapFS{migMinorsPath: &fstest.MapFile{Data: []byte(b.String()), Mode: 0o444}}
}
