package discovery

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/gpulink/gpulink/driver/mig"
)

// hostProcRoot is where the kernel mounts procfs. The NVIDIA driver's
// capability table (driver/nvidia-caps/mig-minors) is global, so the
// plugin's container sees the host's.
const hostProcRoot = "/proc"

// migMinorsPath lists, per GPU minor, GPU instance and compute instance,
// the minor of the /dev/nvidia-caps node that grants access to it, as
// lines "gpu<minor>/gi<gi>/access <cap minor>" and
// "gpu<minor>/gi<gi>/ci<ci>/access <cap minor>".
const migMinorsPath = "driver/nvidia-caps/mig-minors"

// readMIG reads a GPU's MIG mode and, in MIG mode, its existing GPU and
// compute instances. A GPU that is not in MIG mode (or cannot do MIG) gets
// nil. Only the
// current mode counts: a pending one takes effect at a GPU reset, which
// gpulink never does.
func (d *nvmlDiscoverer) readMIG(i int, h nvml.Device, gpuMemBytes int64, minor int, caps migCaps) (*mig.GPU, error) {
	current, _, ret := h.GetMigMode()
	switch {
	case unavailable(ret):
		return nil, nil
	case ret != nvml.SUCCESS:
		return nil, callError(i, "GetMigMode", ret)
	case current != nvml.DEVICE_MIG_ENABLE:
		// Not in MIG mode: a whole GPU like any other.
		return nil, nil
	}
	uuids, err := migUUIDs(i, h)
	if err != nil {
		return nil, err
	}
	out := &mig.GPU{Enabled: true}
	for giProfile := range nvml.GPU_INSTANCE_PROFILE_COUNT {
		info, ret := h.GetGpuInstanceProfileInfo(giProfile)
		if absentProfile(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("GetGpuInstanceProfileInfo(%d)", giProfile), ret)
		}
		giName, err := mig.GIProfileName(giProfile, int(info.SliceCount), info.MemorySizeMB, gpuMemBytes)
		if err != nil {
			return nil, fmt.Errorf("GPU %d: %w", i, err)
		}
		p, err := readGIProfile(i, h, info, giName)
		if err != nil {
			return nil, err
		}
		if len(p.Placements) > 0 {
			out.Profiles = append(out.Profiles, p)
		}
		gis, ret := h.GetGpuInstances(&info)
		if absentProfile(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("GetGpuInstances(profile %d)", giProfile), ret)
		}
		for _, gi := range gis {
			insts, err := readGPUInstance(i, gi, info, giName, uuids, minor, caps)
			if err != nil {
				return nil, err
			}
			out.Instances = append(out.Instances, insts...)
		}
	}
	mig.SortProfiles(out.Profiles)
	slices.SortFunc(out.Instances, func(a, b mig.Instance) int {
		if a.GI != b.GI {
			return a.GI - b.GI
		}
		return a.CI - b.CI
	})
	return out, nil
}

// readGIProfile reads where NVML can place instances of a GPU instance
// profile, for MIG on demand. A profile NVML cannot place gets none.
func readGIProfile(i int, h nvml.Device, info nvml.GpuInstanceProfileInfo, giName string) (mig.GIProfile, error) {
	if info.MemorySizeMB > math.MaxInt64>>20 {
		return mig.GIProfile{}, fmt.Errorf("GPU %d: GPU instance profile %d: memory %d MiB does not fit int64 bytes", i, info.Id, info.MemorySizeMB)
	}
	p := mig.GIProfile{Profile: mig.Profile{
		Name:            giName,
		GIProfileID:     int(info.Id),
		CIProfileID:     -1,
		GISlices:        int(info.SliceCount),
		CISlices:        int(info.SliceCount),
		MemoryBytes:     int64(info.MemorySizeMB) << 20,
		Multiprocessors: int(info.MultiprocessorCount),
		CopyEngines:     int(info.CopyEngineCount),
		Decoders:        int(info.DecoderCount),
		Encoders:        int(info.EncoderCount),
		JPEGs:           int(info.JpegCount),
		OFAs:            int(info.OfaCount),
	}, MaxInstances: int(info.InstanceCount)}
	placements, ret := h.GetGpuInstancePossiblePlacements(&info)
	if absentProfile(ret) {
		return p, nil
	}
	if ret != nvml.SUCCESS {
		return mig.GIProfile{}, callError(i, fmt.Sprintf("GetGpuInstancePossiblePlacements(profile %d)", info.Id), ret)
	}
	for _, pl := range placements {
		if pl.Size == 0 {
			return mig.GIProfile{}, fmt.Errorf("GPU %d: GetGpuInstancePossiblePlacements(profile %d): placement at %d has size 0", i, info.Id, pl.Start)
		}
		p.Placements = append(p.Placements, mig.Placement{Start: int(pl.Start), Size: int(pl.Size)})
	}
	return p, nil
}

// readGPUInstance reads the compute instances of one GPU instance.
func readGPUInstance(i int, gi nvml.GpuInstance, giProfile nvml.GpuInstanceProfileInfo, giName string, uuids map[[2]int]string, minor int, caps migCaps) ([]mig.Instance, error) {
	giInfo, ret := gi.GetInfo()
	if ret != nvml.SUCCESS {
		return nil, callError(i, "GpuInstance.GetInfo", ret)
	}
	giID := int(giInfo.Id)
	var out []mig.Instance
	for ciProfile := range nvml.COMPUTE_INSTANCE_PROFILE_COUNT {
		ciInfo, ret := gi.GetComputeInstanceProfileInfo(ciProfile, nvml.COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
		if absentProfile(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("GPU instance %d: GetComputeInstanceProfileInfo(%d)", giID, ciProfile), ret)
		}
		cis, ret := gi.GetComputeInstances(&ciInfo)
		if absentProfile(ret) {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("GPU instance %d: GetComputeInstances(profile %d)", giID, ciProfile), ret)
		}
		for _, ci := range cis {
			info, ret := ci.GetInfo()
			if ret != nvml.SUCCESS {
				return nil, callError(i, fmt.Sprintf("GPU instance %d: ComputeInstance.GetInfo", giID), ret)
			}
			ciID := int(info.Id)
			if giProfile.MemorySizeMB > math.MaxInt64>>20 {
				return nil, fmt.Errorf("GPU %d: GPU instance %d: profile memory %d MiB does not fit int64 bytes", i, giID, giProfile.MemorySizeMB)
			}
			out = append(out, mig.Instance{
				Profile: mig.Profile{
					Name:            mig.ProfileName(giName, int(giProfile.SliceCount), int(ciInfo.SliceCount)),
					GIProfileID:     int(giProfile.Id),
					CIProfileID:     int(ciInfo.Id),
					GISlices:        int(giProfile.SliceCount),
					CISlices:        int(ciInfo.SliceCount),
					MemoryBytes:     int64(giProfile.MemorySizeMB) << 20,
					Multiprocessors: int(ciInfo.MultiprocessorCount),
					CopyEngines:     int(giProfile.CopyEngineCount),
					Decoders:        int(giProfile.DecoderCount),
					Encoders:        int(giProfile.EncoderCount),
					JPEGs:           int(giProfile.JpegCount),
					OFAs:            int(giProfile.OfaCount),
				},
				GI:         giID,
				CI:         ciID,
				Placement:  mig.Placement{Start: int(giInfo.Placement.Start), Size: int(giInfo.Placement.Size)},
				UUID:       uuids[[2]int{giID, ciID}],
				GICapMinor: caps.lookup(fmt.Sprintf("gpu%d/gi%d/access", minor, giID)),
				CICapMinor: caps.lookup(fmt.Sprintf("gpu%d/gi%d/ci%d/access", minor, giID, ciID)),
			})
		}
	}
	return out, nil
}

// migUUIDs maps (GPU instance, compute instance) to the MIG device's UUID,
// through the MIG device handles NVML numbers 0..max-1 per GPU (slots
// without a device answer NOT_FOUND).
func migUUIDs(i int, h nvml.Device) (map[[2]int]string, error) {
	n, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		return nil, callError(i, "GetMaxMigDeviceCount", ret)
	}
	out := make(map[[2]int]string, n)
	for k := range n {
		m, ret := h.GetMigDeviceHandleByIndex(k)
		if ret == nvml.ERROR_NOT_FOUND || ret == nvml.ERROR_INVALID_ARGUMENT {
			continue
		}
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("GetMigDeviceHandleByIndex(%d)", k), ret)
		}
		gi, ret := m.GetGpuInstanceId()
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("MIG device %d: GetGpuInstanceId", k), ret)
		}
		ci, ret := m.GetComputeInstanceId()
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("MIG device %d: GetComputeInstanceId", k), ret)
		}
		uuid, ret := m.GetUUID()
		if ret != nvml.SUCCESS {
			return nil, callError(i, fmt.Sprintf("MIG device %d: GetUUID", k), ret)
		}
		out[[2]int{gi, ci}] = uuid
	}
	return out, nil
}

// absentProfile: the GPU has no such profile (NVML answers
// NOT_SUPPORTED or INVALID_ARGUMENT for profile IDs a GPU model lacks).
func absentProfile(ret nvml.Return) bool {
	return ret == nvml.ERROR_NOT_SUPPORTED || ret == nvml.ERROR_INVALID_ARGUMENT || ret == nvml.ERROR_FUNCTION_NOT_FOUND
}

// migCaps is the driver's capability table: access path -> cap minor.
type migCaps map[string]int

// lookup returns the cap minor of a path, -1 when the table lacks it.
func (c migCaps) lookup(path string) int {
	if m, ok := c[path]; ok {
		return m
	}
	return -1
}

// readMIGCaps reads the capability table from procfs. A missing table
// (driver without MIG support, no procfs given) is an empty one: the
// instances then have unknown cap minors and cannot be prepared, which
// prepare reports by name.
func readMIGCaps(proc fs.FS) (migCaps, error) {
	if proc == nil {
		return migCaps{}, nil
	}
	data, err := fs.ReadFile(proc, migMinorsPath)
	if errors.Is(err, fs.ErrNotExist) {
		return migCaps{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", migMinorsPath, err)
	}
	return parseMIGCaps(data)
}

// parseMIGCaps parses lines "<path> <minor>".
func parseMIGCaps(data []byte) (migCaps, error) {
	caps := migCaps{}
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		path, minorText, ok := strings.Cut(line, " ")
		minor, err := strconv.Atoi(strings.TrimSpace(minorText))
		if !ok || err != nil || minor < 0 {
			return nil, fmt.Errorf("%s line %d: %q: want \"<path> <minor>\"", migMinorsPath, n, line)
		}
		caps[path] = minor
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", migMinorsPath, err)
	}
	return caps, nil
}
