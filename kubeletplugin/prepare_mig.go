package kubeletplugin

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/klog/v2"
	cdispec "tags.cncf.io/container-device-interface/specs-go"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/mig"
)

// PreparedMIG is the MIG device a result got: the compute instance CI of
// GPU instance GI on the GPU of the result's Index and Minor.
type PreparedMIG struct {
	Profile    string `json:"profile"`
	GI         int    `json:"gi"`
	CI         int    `json:"ci"`
	ParentUUID string `json:"parentUUID,omitempty"`
	// GICapMinor and CICapMinor name the /dev/nvidia-caps/nvidia-cap<minor>
	// nodes that grant access to the instances; -1 when unknown.
	GICapMinor int `json:"giCapMinor"`
	CICapMinor int `json:"ciCapMinor"`
	// OnDemand is set for a partition of a GPU partitioned on demand
	// (ondemand.go): its instance is created by prepare and destroyed by
	// unprepare; GI, CI, the cap minors and the device's UUID are known
	// once it is created (-1 and empty until then).
	OnDemand *OnDemandMIG `json:"onDemand,omitempty"`
}

// migCapNodes are the capability device nodes of a MIG device: a process
// may use a GPU instance and a compute instance only if it can open them.
func (m *PreparedMIG) capNodes() ([]string, error) {
	if m.GICapMinor < 0 || m.CICapMinor < 0 {
		return nil, fmt.Errorf("MIG device GI %d CI %d: the driver's capability table (/proc/driver/nvidia-caps/mig-minors) does not list its access minors", m.GI, m.CI)
	}
	return []string{
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", m.GICapMinor),
		fmt.Sprintf("/dev/nvidia-caps/nvidia-cap%d", m.CICapMinor),
	}, nil
}

// planMIG checks a result naming a MIG device against this node's GPUs
// and returns what preparing it means.
func (d *Driver) planMIG(field string, r resourceapi.DeviceRequestAllocationResult) (PreparedDevice, error) {
	parent, gi, ci, err := driver.ParseMIGDeviceName(r.Device)
	if err != nil {
		return PreparedDevice{}, fmt.Errorf("%s.device: %w", field, err)
	}
	p, ok := d.topo.Position(parent)
	if !ok {
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: no GPU with index %d on node %s", field, r.Device, parent, d.opts.NodeName)
	}
	gpu := d.topo.GPUs[p]
	if !gpu.MIGEnabled() {
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: GPU %d is not in MIG mode on node %s", field, r.Device, parent, d.opts.NodeName)
	}
	if gpu.MIG.OnDemand {
		// Every instance on it was created for a claim's partition and
		// belongs to that claim alone; naming one by its IDs would put
		// two tenants on one instance, and the first one's unprepare
		// would destroy it under the second.
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: GPU %d on node %s is partitioned on demand (--mig-on-demand): its MIG instances belong to the claims whose partitions created them and are never given out as MIG devices", field, r.Device, parent, d.opts.NodeName)
	}
	var in *mig.Instance
	have := make([]string, 0, len(gpu.MIG.Instances))
	for k := range gpu.MIG.Instances {
		c := &gpu.MIG.Instances[k]
		have = append(have, driver.MIGDeviceName(parent, c.GI, c.CI)+" ("+c.Profile.Name+")")
		if c.GI == gi && c.CI == ci {
			in = c
		}
	}
	if in == nil {
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: GPU %d on node %s has no compute instance %d in GPU instance %d (it has: %s)", field, r.Device, parent, d.opts.NodeName, ci, gi, strings.Join(have, ", "))
	}
	if r.ShareID != nil {
		return PreparedDevice{}, fmt.Errorf("%s.shareID: %s: MIG device %q (profile %s) is given out whole, never in shares", field, *r.ShareID, r.Device, in.Profile.Name)
	}
	if in.Profile.Name == "" {
		return PreparedDevice{}, fmt.Errorf("%s.device: %q: the MIG device's profile is unknown", field, r.Device)
	}
	if in.UUID == "" {
		// Without it NVIDIA_VISIBLE_DEVICES could only name the parent,
		// which would hand the container the whole GPU.
		return PreparedDevice{}, fmt.Errorf("%s.device: %q (profile %s): NVML reported no MIG device UUID for it", field, r.Device, in.Profile.Name)
	}
	return PreparedDevice{
		Request: r.Request, Pool: r.Pool, Device: r.Device,
		Index: gpu.Index, Minor: gpu.Minor, UUID: in.UUID, PCIBusID: gpu.PCIBusID,
		AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
		MIG: &PreparedMIG{
			Profile: in.Profile.Name, GI: in.GI, CI: in.CI, ParentUUID: gpu.UUID,
			GICapMinor: in.GICapMinor, CICapMinor: in.CICapMinor,
		},
	}, nil
}

// checkMIGConflicts: a MIG device is exclusive, within the claim and
// across prepared claims (admin access exempt). Prepared instances are
// known by GPU and IDs, not by device name, so that an instance created
// for another claim's partition (named gpu-N-part-...) is found too when
// this claim names it as gpu-N-mig-<GI>-<CI>. A refusal names no other
// claim (refuseBeside).
func (d *Driver) checkMIGConflicts(logger klog.Logger, pc *PreparedClaim, resultIdx []int) error {
	held := map[migInstanceKey]*PreparedClaim{}
	for uid, other := range d.cp.Claims {
		if uid == pc.UID {
			continue
		}
		for _, dev := range other.Devices {
			if k, ok := preparedInstance(dev); ok && !dev.AdminAccess {
				held[k] = other
			}
		}
	}
	inClaim := map[string]int{}
	for j, dev := range pc.Devices {
		if dev.MIG == nil || dev.AdminAccess {
			continue
		}
		field := resultField(resultIdx[j])
		if k, ok := inClaim[dev.Device]; ok {
			return fmt.Errorf("%s.device: MIG device %q is allocated twice (also in %s)", field, dev.Device, resultField(resultIdx[k]))
		}
		inClaim[dev.Device] = j
		k, ok := preparedInstance(dev)
		if !ok {
			continue // a partition: checkPartitionConflicts
		}
		if other, ok := held[k]; ok {
			return refuseBeside(logger, pc, other, fmt.Errorf("%s.device: MIG device %q is already prepared for another claim", field, dev.Device))
		}
	}
	return nil
}

// migInstanceKey names a MIG instance on the node: its GPU's index, GPU
// instance and compute instance IDs.
type migInstanceKey struct{ gpu, gi, ci int }

// preparedInstance is the instance a prepared device holds: a static MIG
// device's, or a partition's once its instance is created.
func preparedInstance(dev PreparedDevice) (migInstanceKey, bool) {
	if dev.MIG == nil || dev.MIG.GI < 0 || dev.MIG.CI < 0 {
		return migInstanceKey{}, false
	}
	return migInstanceKey{dev.Index, dev.MIG.GI, dev.MIG.CI}, true
}

// addMIGNodes adds a MIG device's capability nodes to its CDI device,
// beside its GPU's /dev/nvidia<minor>.
func addMIGNodes(edits *cdispec.ContainerEdits, g claimGPU, addNode func(*cdispec.ContainerEdits, string) error) error {
	if g.mig == nil {
		return nil
	}
	nodes, err := g.mig.capNodes()
	if err != nil {
		return fmt.Errorf("%s: %w", g.device, err)
	}
	for _, n := range nodes {
		if err := addNode(edits, n); err != nil {
			return err
		}
	}
	return nil
}
