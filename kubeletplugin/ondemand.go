package kubeletplugin

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/driver/topology"
)

// MIG on demand (driver/mig/ondemand.go): the GPUs in MIG mode that
// --mig-on-demand names are published as their partitions; preparing a
// claim that got one creates its GPU instance and compute instance, and
// unpreparing it destroys them.
//
// Crash safety rests on the checkpoint's PrepareStarted record, written
// before anything is created: it names the GPU, the profile and the
// placement (OnDemandMIG), so that recovery after a crash anywhere in a
// prepare destroys whatever the interrupted prepare created (by profile
// and placement, idempotently) and forgets the claim, like any claim
// left in PrepareStarted. A claim in PrepareCompleted keeps its instance
// (it is still prepared; the kubelet unprepares it when its pods are
// gone).
//
// Which instances are gpulink's: only those on GPUs it manages. A GPU
// named by --mig-on-demand is adopted (Checkpoint.OnDemandGPUs) when the
// plugin finds it without instances, or with only instances that
// prepared claims hold; from then on gpulink owns every instance on it,
// and at each start destroys those no prepared claim holds (left by a
// crash, or by a checkpoint lost since). A GPU that has other instances
// and was never adopted (instances an administrator made) is not
// partitioned on demand: it is published with its instances as static
// MIG devices, and the plugin logs how to hand it over. Instances on
// GPUs not named by --mig-on-demand are never touched.

// MIGInstanceManager creates and destroys the instances of MIG on
// demand; *discovery.MIGInstances is the NVML one.
type MIGInstanceManager interface {
	Create(ctx context.Context, parentUUID string, p mig.Partition) (mig.Instance, error)
	Destroy(ctx context.Context, parentUUID string, giProfileID int, pl mig.Placement) error
	GPUInstances(ctx context.Context, parentUUID string) ([]discovery.GPUInstance, error)
}

// OnDemandMIG is what a prepared partition records before its instance
// is created: enough to find and destroy it after a crash.
type OnDemandMIG struct {
	GIProfileID int           `json:"giProfileID"`
	Placement   mig.Placement `json:"placement"`
}

// migOnDemandAll is the --mig-on-demand value that names every GPU in MIG
// mode.
const migOnDemandAll = "all"

// migOnDemandSelection is the parsed --mig-on-demand: all GPUs in MIG
// mode, or GPUs by index or UUID.
type migOnDemandSelection struct {
	all     bool
	indexes map[int]bool
	uuids   map[string]bool
}

// parseMIGOnDemand parses --mig-on-demand: empty (none), "all", or GPU
// indexes and UUIDs separated by commas.
func parseMIGOnDemand(s string) (migOnDemandSelection, error) {
	sel := migOnDemandSelection{indexes: map[int]bool{}, uuids: map[string]bool{}}
	s = strings.TrimSpace(s)
	if s == "" {
		return sel, nil
	}
	if s == migOnDemandAll {
		sel.all = true
		return sel, nil
	}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if strings.HasPrefix(item, "GPU-") {
			sel.uuids[item] = true
			continue
		}
		i, err := strconv.Atoi(item)
		if err != nil || i < 0 {
			return sel, fmt.Errorf("--mig-on-demand=%q: %q is neither a GPU index nor a GPU UUID (GPU-...); want %q or a comma-separated list", s, item, migOnDemandAll)
		}
		sel.indexes[i] = true
	}
	return sel, nil
}

func (s migOnDemandSelection) empty() bool {
	return !s.all && len(s.indexes) == 0 && len(s.uuids) == 0
}

// markOnDemand sets mig.GPU.OnDemand on the GPUs the selection names,
// except those refused (not adopted, see above). A GPU named by index or
// UUID must exist and be in MIG mode: gpulink never enables MIG mode.
func (s migOnDemandSelection) markOnDemand(t *topology.Topology, refused map[string]string) error {
	if s.empty() {
		return nil
	}
	// Set afresh from the selection: a discoverer may hand out a topology
	// marked before.
	found := map[string]bool{}
	for i := range t.GPUs {
		g := &t.GPUs[i]
		if g.MIGEnabled() {
			g.MIG.OnDemand = false
		}
		named := s.indexes[g.Index] || s.uuids[g.UUID]
		if named {
			found[strconv.Itoa(g.Index)], found[g.UUID] = true, true
		}
		if !named && !s.all {
			continue
		}
		if !g.MIGEnabled() {
			if named {
				return fmt.Errorf("--mig-on-demand: GPU %d (%s) is not in MIG mode; gpulink never changes a GPU's MIG mode: enable it (nvidia-smi -i %d -mig 1, then a GPU reset) or leave the GPU out", g.Index, g.UUID, g.Index)
			}
			continue
		}
		if _, ok := refused[g.UUID]; ok {
			continue
		}
		g.MIG.OnDemand = true
	}
	var missing []string
	for i := range s.indexes {
		if !found[strconv.Itoa(i)] {
			missing = append(missing, strconv.Itoa(i))
		}
	}
	for u := range s.uuids {
		if !found[u] {
			missing = append(missing, u)
		}
	}
	if len(missing) > 0 {
		slices.Sort(missing)
		return fmt.Errorf("--mig-on-demand: no GPU %s on this node", strings.Join(missing, ", "))
	}
	return nil
}

// planPartition checks a result naming a partition against this node's
// GPUs and returns what preparing it means: the instance is created by
// apply, its IDs, UUID and cap minors filled in then.
func (d *Driver) planPartition(field string, r resourceapi.DeviceRequestAllocationResult) (PreparedDevice, error) {
	parent, err := driver.ParsePartitionParent(r.Device)
	if err != nil {
		return PreparedDevice{}, fmt.Errorf("%s.device: %w", field, err)
	}
	p, ok := d.topo.Position(parent)
	if !ok {
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: no GPU with index %d on node %s", field, r.Device, parent, d.opts.NodeName)
	}
	gpu := d.topo.GPUs[p]
	switch {
	case !gpu.MIGEnabled():
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: GPU %d is not in MIG mode on node %s", field, r.Device, parent, d.opts.NodeName)
	case !gpu.MIG.OnDemand:
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: GPU %d on node %s is not partitioned on demand (--mig-on-demand)", field, r.Device, parent, d.opts.NodeName)
	case r.ShareID != nil:
		return PreparedDevice{}, fmt.Errorf("%s.shareID: %s: partition %q is given out whole, never in shares", field, *r.ShareID, r.Device)
	case r.AdminAccess != nil && *r.AdminAccess:
		return PreparedDevice{}, fmt.Errorf("%s.adminAccess: partition %q exists only while a claim holds it; admin access is for existing devices", field, r.Device)
	}
	part, err := findPartition(gpu, r.Device)
	if err != nil {
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: %w", field, r.Device, err)
	}
	return PreparedDevice{
		Request: r.Request, Pool: r.Pool, Device: r.Device,
		Index: gpu.Index, Minor: gpu.Minor, PCIBusID: gpu.PCIBusID,
		MIG: &PreparedMIG{
			Profile: part.Profile.Name, GI: -1, CI: -1, ParentUUID: gpu.UUID,
			GICapMinor: -1, CICapMinor: -1,
			OnDemand: &OnDemandMIG{GIProfileID: part.Profile.GIProfileID, Placement: part.Placement},
		},
	}, nil
}

// findPartition finds the partition a device name names on a GPU, or
// says what of the name the GPU lacks: the profile, or the placement.
func findPartition(gpu topology.GPU, name string) (mig.Partition, error) {
	slug, start := splitPartitionName(name)
	var profiles []string
	for _, gp := range gpu.MIG.Profiles {
		profiles = append(profiles, gp.Profile.Name)
		n, err := driver.PartitionDeviceName(gpu.Index, gp.Profile.Name, 0)
		if err != nil {
			continue
		}
		if s, _ := splitPartitionName(n); s != slug {
			continue
		}
		var starts []string
		for _, pl := range gp.Placements {
			if strconv.Itoa(pl.Start) == start {
				return mig.Partition{Profile: gp.Profile, Placement: pl}, nil
			}
			starts = append(starts, strconv.Itoa(pl.Start))
		}
		return mig.Partition{}, fmt.Errorf("MIG profile %s of GPU %d (%s) has no placement starting at memory slice %q (its placements start at %s)",
			gp.Profile.Name, gpu.Index, gpu.ProductName, start, strings.Join(starts, ", "))
	}
	return mig.Partition{}, fmt.Errorf("GPU %d (%s) has no MIG profile %q; its model has %s", gpu.Index, gpu.ProductName, slug, strings.Join(profiles, ", "))
}

// splitPartitionName returns the profile and placement parts of a
// partition's name (gpu-<index>-part-<profile>-at-<start>).
func splitPartitionName(name string) (profile, start string) {
	_, rest, _ := strings.Cut(name, "-part-")
	if i := strings.LastIndex(rest, "-at-"); i >= 0 {
		return rest[:i], rest[i+len("-at-"):]
	}
	return rest, ""
}

// checkPartitionConflicts: the partitions prepared on a GPU, this claim's
// and every other prepared claim's, must fit on it together (the rule the
// published counters enforce: no overlap, enough compute slices, memory
// and instances of limited profiles). It is the last line of defense
// against an allocator that ignored the counters. A refusal names the
// partitions in the way but not their claims (refuseBeside).
func (d *Driver) checkPartitionConflicts(logger klog.Logger, pc *PreparedClaim, resultIdx []int) error {
	type held struct {
		part mig.Partition
		name string
		by   *PreparedClaim // nil: pc
	}
	byGPU := map[int][]held{}
	for uid, other := range d.cp.Claims {
		if uid == pc.UID {
			continue
		}
		for _, dev := range other.Devices {
			if p, ok := d.partitionOf(dev); ok {
				byGPU[dev.Index] = append(byGPU[dev.Index], held{p, dev.Device + " of another claim", other})
			}
		}
	}
	for j, dev := range pc.Devices {
		p, ok := d.partitionOf(dev)
		if !ok {
			continue
		}
		pos, _ := d.topo.Position(dev.Index)
		gpu := d.topo.GPUs[pos]
		parts := []mig.Partition{p}
		var names []string
		var by *PreparedClaim
		for _, h := range byGPU[dev.Index] {
			parts = append(parts, h.part)
			names = append(names, h.name)
			if by == nil {
				by = h.by
			}
		}
		if err := gpu.MIG.Capacity().Fits(parts); err != nil {
			err = fmt.Errorf("%s.device: partition %q cannot exist beside the partitions already prepared on GPU %d (%s): %w",
				resultField(resultIdx[j]), dev.Device, dev.Index, strings.Join(names, ", "), err)
			if by == nil {
				return err
			}
			return refuseBeside(logger, pc, by, err)
		}
		byGPU[dev.Index] = append(byGPU[dev.Index], held{p, dev.Device + " of this claim", nil})
	}
	return nil
}

// partitionOf returns the partition a prepared device holds on a GPU
// partitioned on demand.
func (d *Driver) partitionOf(dev PreparedDevice) (mig.Partition, bool) {
	if dev.MIG == nil || dev.MIG.OnDemand == nil {
		return mig.Partition{}, false
	}
	pos, ok := d.topo.Position(dev.Index)
	if !ok || !d.topo.GPUs[pos].MIGEnabled() {
		return mig.Partition{}, false
	}
	for _, gp := range d.topo.GPUs[pos].MIG.Profiles {
		if gp.Profile.GIProfileID == dev.MIG.OnDemand.GIProfileID {
			return mig.Partition{Profile: gp.Profile, Placement: dev.MIG.OnDemand.Placement}, true
		}
	}
	return mig.Partition{}, false
}

// createPartitions creates the instances of a claim's partitions and
// fills in their IDs, UUIDs and cap minors. On error the instances
// created so far are left to the caller's teardown (destroyPartitions),
// which finds them by profile and placement.
func (d *Driver) createPartitions(ctx context.Context, pc *PreparedClaim) error {
	for i := range pc.Devices {
		dev := &pc.Devices[i]
		p, ok := d.partitionOf(*dev)
		if !ok {
			if dev.MIG != nil && dev.MIG.OnDemand != nil {
				return fmt.Errorf("%s: GPU %d no longer has MIG profile %d", dev.Device, dev.Index, dev.MIG.OnDemand.GIProfileID)
			}
			continue
		}
		if d.migInstances == nil {
			return fmt.Errorf("%s: this plugin cannot create MIG instances (no NVML)", dev.Device)
		}
		in, err := d.migInstances.Create(ctx, dev.MIG.ParentUUID, p)
		if err != nil {
			return fmt.Errorf("%s: %w", dev.Device, err)
		}
		dev.UUID = in.UUID
		dev.MIG.GI, dev.MIG.CI = in.GI, in.CI
		dev.MIG.GICapMinor, dev.MIG.CICapMinor = in.GICapMinor, in.CICapMinor
		klog.FromContext(ctx).V(2).Info("Created MIG instance", "claim", klog.KRef(pc.Namespace, pc.Name), "device", dev.Device,
			"gpu", dev.Index, "profile", p.Profile.Name, "placement", p.Placement, "gi", in.GI, "ci", in.CI, "uuid", in.UUID)
	}
	return nil
}

// destroyPartitions destroys the instances of a claim's partitions
// (compute instance, then GPU instance). Idempotent: an instance that is
// gone already is no error, so an interrupted prepare's rollback and an
// unprepare's retry both work.
func (d *Driver) destroyPartitions(ctx context.Context, pc *PreparedClaim) error {
	var errs []error
	for _, dev := range pc.Devices {
		if dev.MIG == nil || dev.MIG.OnDemand == nil {
			continue
		}
		if d.migInstances == nil {
			errs = append(errs, fmt.Errorf("%s: this plugin cannot destroy MIG instances (no NVML)", dev.Device))
			continue
		}
		if err := d.migInstances.Destroy(ctx, dev.MIG.ParentUUID, dev.MIG.OnDemand.GIProfileID, dev.MIG.OnDemand.Placement); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", dev.Device, err))
			continue
		}
		klog.FromContext(ctx).V(2).Info("Destroyed MIG instance", "claim", klog.KRef(pc.Namespace, pc.Name), "device", dev.Device, "gpu", dev.Index)
	}
	return errors.Join(errs...)
}

// MIGInstancesFor returns the MIG instance manager over the same NVML
// library (real or simulated) as a discoverer, nil for one that has none
// (topology-file discovery).
func MIGInstancesFor(d discovery.Discoverer) MIGInstanceManager {
	if m, ok := discovery.MIGInstancesOf(d); ok {
		return m
	}
	return nil
}
