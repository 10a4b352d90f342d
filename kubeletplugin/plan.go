package kubeletplugin

import (
	"errors"
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// planClaim validates a claim against this node and computes what
// preparing it means, without side effects.
func (d *Driver) planClaim(logger klog.Logger, claim *resourceapi.ResourceClaim) (*PreparedClaim, error) {
	alloc := claim.Status.Allocation
	if alloc == nil {
		return nil, errors.New("status.allocation: not allocated")
	}
	if d.topo == nil {
		return nil, errors.New("no GPU discovery has succeeded yet on this node")
	}
	configs, err := newClaimConfigs(logger, alloc)
	if err != nil {
		return nil, err
	}
	pc := &PreparedClaim{UID: claim.UID, Namespace: claim.Namespace, Name: claim.Name}
	var resultIdx []int // position in pc.Devices -> index in results
	for i, r := range alloc.Devices.Results {
		if r.Driver != driver.Name {
			continue
		}
		field := resultField(i)
		if r.Pool != d.opts.NodeName {
			return nil, fmt.Errorf("%s.pool: %q is not this node's pool %q", field, r.Pool, d.opts.NodeName)
		}
		if driver.IsPartitionDeviceName(r.Device) {
			if _, err := configs.forRequest(r.Request); err != nil {
				return nil, err
			}
			dev, err := d.planPartition(field, r) // ondemand.go
			if err != nil {
				return nil, err
			}
			resultIdx = append(resultIdx, i)
			pc.Devices = append(pc.Devices, dev)
			continue
		}
		if driver.IsMIGDeviceName(r.Device) {
			if _, err := configs.forRequest(r.Request); err != nil {
				return nil, err
			}
			dev, err := d.planMIG(field, r) // prepare_mig.go
			if err != nil {
				return nil, err
			}
			resultIdx = append(resultIdx, i)
			pc.Devices = append(pc.Devices, dev)
			continue
		}
		index, err := driver.ParseDeviceName(r.Device)
		if err != nil {
			return nil, fmt.Errorf("%s.device: %w", field, err)
		}
		p, ok := d.topo.Position(index)
		if !ok {
			return nil, fmt.Errorf("%s.device: %q: no GPU with index %d on node %s", field, r.Device, index, d.opts.NodeName)
		}
		gpu := d.topo.GPUs[p]
		if gpu.MIGEnabled() {
			return nil, fmt.Errorf("%s.device: %q: GPU %d is in MIG mode on node %s and is given out only as its MIG devices, not whole or in shares", field, r.Device, gpu.Index, d.opts.NodeName)
		}
		rc, err := configs.forRequest(r.Request)
		if err != nil {
			return nil, err
		}
		dev := PreparedDevice{
			Request: r.Request, Pool: r.Pool, Device: r.Device,
			Index: gpu.Index, Minor: gpu.Minor, UUID: gpu.UUID, PCIBusID: gpu.PCIBusID,
			ShareID:     r.ShareID,
			AdminAccess: r.AdminAccess != nil && *r.AdminAccess,
		}
		if r.ShareID != nil {
			share, err := d.planShare(field, r, gpu, rc)
			if err != nil {
				return nil, err
			}
			dev.Share = share
		}
		resultIdx = append(resultIdx, i)
		pc.Devices = append(pc.Devices, dev)
	}
	if err := checkClaimShape(pc, resultIdx); err != nil {
		return nil, err
	}
	if err := checkClaimPriority(pc, resultIdx); err != nil {
		return nil, err
	}
	if err := d.checkConflicts(logger, pc, resultIdx); err != nil {
		return nil, err
	}
	if err := d.checkMIGConflicts(logger, pc, resultIdx); err != nil {
		return nil, err
	}
	if err := d.checkPartitionConflicts(logger, pc, resultIdx); err != nil {
		return nil, err
	}
	if len(pc.Devices) > 0 {
		pc.CDIDeviceID = CDIDeviceID(pc.UID)
		for i := range pc.Devices {
			pc.Devices[i].CDIDeviceID = CDIDeviceIDForDevice(pc.UID, pc.Devices[i].Device)
		}
	}
	return pc, nil
}

// resultField names an allocation result in error messages.
func resultField(i int) string {
	return fmt.Sprintf("status.allocation.devices.results[%d]", i)
}

// planShare works out the size and strategy of a share.
func (d *Driver) planShare(field string, r resourceapi.DeviceRequestAllocationResult, gpu topology.GPU, rc *requestConfig) (*PreparedShare, error) {
	strategy := rc.resolved.Sharing.Strategy
	if strategy == apiv1alpha1.SharingNone {
		// The controller refuses such requests; a claim allocated by
		// anyone else must not get a share it would refuse either.
		return nil, fmt.Errorf("%s: a share (shareID set) under sharing.strategy=%s, which gives out whole GPUs only", field, apiv1alpha1.SharingNone)
	}
	var explicitMem *resource.Quantity
	var explicitCores *int64
	if s := rc.explicit.Sharing; s != nil {
		explicitMem, explicitCores = s.DefaultMemory, s.DefaultCores
	}
	mem, ok := consumed(r, driver.CapacityMemory)
	switch {
	case ok:
	case explicitMem != nil:
		mem = *explicitMem
	default:
		mem = d.opts.DefaultShareMemory
	}
	var cores int64
	if q, ok := consumed(r, driver.CapacityCores); ok {
		cores = q.Value()
	} else if explicitCores != nil {
		cores = *explicitCores
	} else {
		cores = d.opts.DefaultShareCores
	}
	memBytes := mem.Value()
	memField := field + ".consumedCapacity." + driver.CapacityMemory
	switch {
	case memBytes < sliceformat.MemoryStep:
		return nil, fmt.Errorf("%s: %s: a share needs at least 1Mi of memory", memField, mem.String())
	case gpu.MemoryBytes > 0 && memBytes > gpu.MemoryBytes:
		return nil, fmt.Errorf("%s: %s is larger than GPU %d's %s", memField, mem.String(), gpu.Index,
			resource.NewQuantity(gpu.MemoryBytes, resource.BinarySI).String())
	}
	if cores < 1 || cores > sliceformat.CoresTotal {
		return nil, fmt.Errorf("%s.consumedCapacity.%s: %d: must be between 1 and %d", field, driver.CapacityCores, cores, sliceformat.CoresTotal)
	}
	ps := &PreparedShare{MemoryBytes: memBytes, Cores: cores, Strategy: strategy}
	if v := rc.resolved.Sharing.MemoryOvercommitPercent; v != nil {
		ps.MemoryOvercommitPercent = *v
	}
	if v := rc.resolved.Sharing.Priority; v != nil {
		p := *v
		ps.Priority = &p
	}
	if rc.resolved.ConcurrentMPS() {
		ps.MPSMode = apiv1alpha1.MPSConcurrent
	}
	return ps, nil
}

// consumed looks a capacity up in a result's consumedCapacity, qualified
// with the driver name or not.
func consumed(r resourceapi.DeviceRequestAllocationResult, name string) (resource.Quantity, bool) {
	if q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(name)]; ok {
		return q, true
	}
	q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(driver.Name+"/"+name)]
	return q, ok
}
