package gpucheck

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/driver/topology"
)

// Check names of the MIG rows. They never change a GPU's MIG mode and
// never reset a GPU: they read the mode, and only on a GPU already in MIG
// mode (and without instances) create one partition through the plugin's
// own prepare code, probe it and destroy it.
const (
	CheckMIGMode    = "mig: mode"
	CheckMIGCreate  = "mig: create partition"
	CheckMIGProbe   = "mig: probe in partition"
	CheckMIGDestroy = "mig: destroy partition"
)

// MIGLister lists a GPU's MIG GPU instances as NVML reports them
// (*discovery.MIGInstances): how the rows see that the plugin created and
// destroyed the instance, independently of the plugin's own bookkeeping.
type MIGLister interface {
	GPUInstances(ctx context.Context, parentUUID string) ([]discovery.GPUInstance, error)
}

// migRows runs the MIG rows on the discovered topology.
func (s *suite) migRows(ctx context.Context, topo *topology.Topology) {
	var modes []string
	var target *topology.GPU
	for i := range topo.GPUs {
		g := &topo.GPUs[i]
		switch {
		case g.MIG == nil || !g.MIG.Enabled:
			modes = append(modes, fmt.Sprintf("GPU %d: off", g.Index))
		default:
			modes = append(modes, fmt.Sprintf("GPU %d: on, %d instance(s)", g.Index, len(g.MIG.Instances)))
			if target == nil || (len(target.MIG.Instances) > 0 && len(g.MIG.Instances) == 0) {
				target = g
			}
		}
	}
	s.rep.Add(CheckMIGMode, Pass, "%s (read through NVML; gpu-check never changes MIG mode or resets a GPU)", strings.Join(modes, "; "))
	skip := func(format string, a ...any) {
		for _, n := range []string{CheckMIGCreate, CheckMIGProbe, CheckMIGDestroy} {
			s.rep.Add(n, Skip, format, a...)
		}
	}
	switch {
	case target == nil:
		skip("no GPU is in MIG mode; gpu-check never enables it (nvidia-smi -i <index> -mig 1 and a GPU reset are the administrator's)")
		return
	case len(target.MIG.Instances) > 0:
		skip("every GPU in MIG mode has instances gpu-check did not create (GPU %d: %d); it leaves them and the GPU alone", target.Index, len(target.MIG.Instances))
		return
	case s.deps.NewMIGPreparer == nil || s.deps.MIG == nil:
		skip("this build of the suite has no MIG instance manager")
		return
	}
	part, ok := smallestPartition(target.MIG)
	if !ok {
		skip("GPU %d is in MIG mode but NVML lists no MIG profile placements for it", target.Index)
		return
	}
	s.migPartition(ctx, *target, part)
}

// smallestPartition is the first placement of the GPU's smallest profile
// (fewest compute slices, then least memory, then lowest profile ID): on
// a GPU without instances every placement is free.
func smallestPartition(g *mig.GPU) (mig.Partition, bool) {
	var best *mig.GIProfile
	for i := range g.Profiles {
		p := &g.Profiles[i]
		if len(p.Placements) == 0 {
			continue
		}
		if best == nil || cmp.Or(cmp.Compare(p.Profile.GISlices, best.Profile.GISlices),
			cmp.Compare(p.Profile.MemoryBytes, best.Profile.MemoryBytes),
			cmp.Compare(p.Profile.GIProfileID, best.Profile.GIProfileID)) < 0 {
			best = p
		}
	}
	if best == nil {
		return mig.Partition{}, false
	}
	return mig.Partition{Profile: best.Profile, Placement: best.Placements[0]}, true
}

// MIGClaim is an allocated claim for one partition of a GPU partitioned
// on demand, as the controller writes it.
func MIGClaim(node string, index int, p mig.Partition) (*resourceapi.ResourceClaim, error) {
	name, err := driver.PartitionDeviceName(index, p.Profile.Name, p.Placement.Start)
	if err != nil {
		return nil, err
	}
	return allocatedClaim("mig-partition", resourceapi.DeviceRequestAllocationResult{
		Request: requestName, Driver: driver.Name, Pool: node, Device: name,
	}), nil
}

// migPartition creates the partition by preparing a claim for it, checks
// NVML and nvidia-smi -L see the instance, probes it in a container and
// destroys it by unpreparing the claim.
func (s *suite) migPartition(ctx context.Context, g topology.GPU, part mig.Partition) {
	where := fmt.Sprintf("%s at memory slice %d of GPU %d", part.Profile.Name, part.Placement.Start, g.Index)
	fail := func(format string, a ...any) {
		s.rep.Add(CheckMIGCreate, Fail, format, a...)
		s.rep.Add(CheckMIGProbe, Skip, "no partition was created")
		s.rep.Add(CheckMIGDestroy, Skip, "no partition was created")
	}
	prep, err := s.deps.NewMIGPreparer(ctx, g.Index)
	if err != nil {
		fail("starting the plugin with GPU %d partitioned on demand: %v", g.Index, err)
		return
	}
	claim, err := MIGClaim(s.cfg.NodeName, g.Index, part)
	if err != nil {
		fail("%s: %v", where, err)
		return
	}
	ids, err := prep.Prepare(ctx, claim)
	if err != nil {
		fail("%s: %v", where, err)
		return
	}
	// From here on the instance may exist: always unprepare.
	var errs []string
	if err := s.instanceAt(ctx, g.UUID, part, true); err != nil {
		errs = append(errs, err.Error())
	}
	smi := "nvidia-smi -L not run (dry run)"
	if !s.cfg.DryRun {
		out, err := s.deps.Run(ctx, s.cfg.NVIDIASMI, "-L")
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("%s -L: %v", s.cfg.NVIDIASMI, err))
		case !strings.Contains(string(out), "MIG "+part.Profile.Name):
			errs = append(errs, fmt.Sprintf("%s -L lists no MIG %s device: %q", s.cfg.NVIDIASMI, part.Profile.Name, lastLines(out, 20)))
		default:
			smi = "nvidia-smi -L lists it"
		}
	}
	s.rep.Add(CheckMIGCreate, statusOf(errs), "%s", detailOf(errs, fmt.Sprintf("%s: %s; NVML lists its GPU instance; %s", where, strings.Join(ids, ","), smi)))
	s.migProbe(ctx, prep, ids, g, part)

	if err := prep.Unprepare(ctx, claim); err != nil {
		s.rep.Add(CheckMIGDestroy, Fail, "%s: %v", where, err)
		return
	}
	if err := s.instanceAt(ctx, g.UUID, part, false); err != nil {
		s.rep.Add(CheckMIGDestroy, Fail, "%s: unprepared, but %v", where, err)
		return
	}
	s.rep.Add(CheckMIGDestroy, Pass, "%s: unprepared; NVML lists no GPU instance there", where)
}

// instanceAt checks through NVML that a GPU instance of the partition's
// profile with a compute instance is (want) or is not at its placement.
func (s *suite) instanceAt(ctx context.Context, parentUUID string, part mig.Partition, want bool) error {
	gis, err := s.deps.MIG.GPUInstances(ctx, parentUUID)
	if err != nil {
		return fmt.Errorf("listing the GPU instances of %s: %w", parentUUID, err)
	}
	i := slices.IndexFunc(gis, func(gi discovery.GPUInstance) bool {
		return gi.ProfileID == part.Profile.GIProfileID && gi.Placement == part.Placement
	})
	switch {
	case want && i < 0:
		return fmt.Errorf("NVML lists no GPU instance of profile %d at memory slice %d (it lists %+v)", part.Profile.GIProfileID, part.Placement.Start, gis)
	case want && gis[i].ComputeInstances != 1:
		return fmt.Errorf("the GPU instance at memory slice %d has %d compute instances, want 1", part.Placement.Start, gis[i].ComputeInstances)
	case !want && i >= 0:
		return fmt.Errorf("NVML still lists GPU instance %d at memory slice %d", gis[i].ID, part.Placement.Start)
	}
	return nil
}

// migProbe runs the probe with the partition's CDI devices: it must see
// one MIG device (a MIG-<uuid> in NVIDIA_VISIBLE_DEVICES), the parent's
// device node and capability nodes, no other GPU, and, on a GPU, CUDA must
// see exactly one device with the partition's memory.
func (s *suite) migProbe(ctx context.Context, prep Preparer, ids []string, g topology.GPU, part mig.Partition) {
	r, err := s.container(ctx, prep, ids, RootfsHost)
	if err != nil {
		s.rep.Add(CheckMIGProbe, Fail, "%v", err)
		return
	}
	errs := CheckMIGIsolation(r, g)
	if !s.cfg.DryRun {
		errs = append(errs, CheckCUDAPartition(r, part)...)
	}
	seen := fmt.Sprintf("NVIDIA_VISIBLE_DEVICES=%s; nodes %s", r.Env["NVIDIA_VISIBLE_DEVICES"], strings.Join(r.DevNodes, ","))
	if !s.cfg.DryRun {
		seen += fmt.Sprintf("; CUDA devices %v, memory %v bytes, kernel %s", r.UUIDs, r.MemoryBytes, r.Kernel)
	}
	s.rep.Add(CheckMIGProbe, statusOf(errs), "%s", detailOf(errs, seen))
}

// CheckMIGIsolation checks what a container with one MIG device of GPU g
// sees without CUDA: one MIG-<uuid>, g's device node and no other GPU's,
// and capability nodes.
func CheckMIGIsolation(r *ProbeReport, g topology.GPU) []string {
	var errs []string
	if v := r.Env["NVIDIA_VISIBLE_DEVICES"]; !strings.HasPrefix(v, "MIG-") || strings.Contains(v, ",") {
		errs = append(errs, fmt.Sprintf("NVIDIA_VISIBLE_DEVICES=%q, want one MIG-<uuid>", v))
	}
	caps := 0
	for _, n := range r.DevNodes {
		rest, ok := strings.CutPrefix(n, "/dev/nvidia")
		switch {
		case strings.HasPrefix(n, "/dev/nvidia-caps/nvidia-cap"):
			caps++
		case ok && rest != "" && strings.Trim(rest, "0123456789") == "" && rest != fmt.Sprint(g.Minor):
			errs = append(errs, fmt.Sprintf("device node %s of another GPU", n))
		}
	}
	if !slices.Contains(r.DevNodes, fmt.Sprintf("/dev/nvidia%d", g.Minor)) {
		errs = append(errs, fmt.Sprintf("no /dev/nvidia%d (the parent GPU's node)", g.Minor))
	}
	if caps < 2 {
		errs = append(errs, fmt.Sprintf("%d /dev/nvidia-caps nodes, want the GPU and compute instance's 2", caps))
	}
	return errs
}

// migMemorySlack is how much less than the profile's memory CUDA may
// report for a MIG device (the driver reserves some).
const migMemorySlack = 0.10

// CheckCUDAPartition checks that CUDA saw exactly one device, the one
// NVIDIA_VISIBLE_DEVICES names, with the partition's memory (up to
// migMemorySlack less, never more), and ran the kernel on it.
func CheckCUDAPartition(r *ProbeReport, part mig.Partition) []string {
	if r.CUDA != "" {
		return []string{"CUDA: " + r.CUDA}
	}
	var errs []string
	if r.Devices != 1 || len(r.MemoryBytes) != 1 || len(r.UUIDs) != 1 {
		return []string{fmt.Sprintf("CUDA sees %d devices (memory %v), want the partition only", r.Devices, r.MemoryBytes)}
	}
	want := part.Profile.MemoryBytes
	if got := r.MemoryBytes[0]; got > want || float64(got) < float64(want)*(1-migMemorySlack) {
		errs = append(errs, fmt.Sprintf("CUDA device memory %d MiB, want the %s partition's %d MiB", got/mib, part.Profile.Name, want/mib))
	}
	// CUDA reports a MIG device by its MIG UUID's bytes (printed by the
	// probe as GPU-<uuid>).
	if got, want := strings.TrimPrefix(r.UUIDs[0], "GPU-"), strings.TrimPrefix(r.Env["NVIDIA_VISIBLE_DEVICES"], "MIG-"); got != want {
		errs = append(errs, fmt.Sprintf("CUDA device %s is not the partition's %s", r.UUIDs[0], r.Env["NVIDIA_VISIBLE_DEVICES"]))
	}
	if r.Kernel != "ok" {
		errs = append(errs, "kernel: "+r.Kernel)
	}
	return errs
}
