package compat

// The claim template of a Shape.

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/gpulink/gpulink/driver"
)

// checkInventory refuses a share larger than every known GPU, and a
// memory percentage while no GPU size is known (it is turned into one
// alternative per size).
func (t *Translator) checkInventory(s Shape) error {
	var sizes []int64
	if t.Inventory != nil {
		sizes = t.Inventory.MemorySizes()
	}
	if s.MemoryPercent > 0 && len(sizes) == 0 {
		return fmt.Errorf("%s needs the GPUs' memory sizes and no gpulink GPU is published yet; retry once the kubelet plugin runs", s.From)
	}
	if s.MemoryPercent > 0 && len(sizes) > resourceapi.FirstAvailableDeviceRequestMaxSize {
		// A percentage becomes one firstAvailable alternative per memory
		// size, and a request may have at most 8 of them.
		names := make([]string, len(sizes))
		for i, size := range sizes {
			names[i] = resource.NewQuantity(size, resource.BinarySI).String()
		}
		return fmt.Errorf("%s: the cluster's GPUs come in %d memory sizes (%s) and a claim can offer at most %d (one firstAvailable alternative per size, since DRA capacity requests are absolute); ask for memory in MiB (nvidia.com/gpumem) instead",
			s.From, len(sizes), strings.Join(names, ", "), resourceapi.FirstAvailableDeviceRequestMaxSize)
	}
	if s.Memory > 0 && len(sizes) > 0 && s.Memory > sizes[len(sizes)-1] {
		return fmt.Errorf("%s: %s per GPU is more than any GPU has (largest %s)", s.From,
			resource.NewQuantity(s.Memory, resource.BinarySI).String(), resource.NewQuantity(sizes[len(sizes)-1], resource.BinarySI).String())
	}
	return nil
}

// template is the claim template for a shape: whole GPUs from the whole
// class, shares from the share class with capacity requests. A memory
// percentage becomes one firstAvailable alternative per GPU memory size
// (DRA capacity requests are absolute), smallest GPUs first so the large
// ones stay free.
func (t *Translator) template(s Shape, selectors []string) (resourceapi.ResourceClaimTemplateSpec, error) {
	sels := make([]resourceapi.DeviceSelector, 0, len(selectors))
	for _, e := range selectors {
		sels = append(sels, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	req := resourceapi.DeviceRequest{Name: RequestName}
	var more []resourceapi.DeviceRequest
	switch {
	case s.MIG != "":
		// One request per profile: "gpu", then "gpu-1", "gpu-2", ...
		for i, p := range migProfiles(s.MIG) {
			r := resourceapi.DeviceRequest{Name: migRequestName(i), Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: t.Config.MIGClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: p.count,
				Selectors: append(slices.Clone(sels), resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: MIGProfileSelector(p.profile)}}),
			}}
			if i == 0 {
				req = r
			} else {
				more = append(more, r)
			}
		}
	case !s.Share:
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: t.Config.WholeClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: s.Count, Selectors: sels}
	case s.MemoryPercent > 0:
		for i, size := range t.Inventory.MemorySizes() {
			mem := percentOfMemory(size, s.MemoryPercent)
			sub := resourceapi.DeviceSubRequest{
				Name:            "m" + strconv.Itoa(i),
				DeviceClassName: t.Config.ShareClass,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           s.Count,
				Selectors: append(slices.Clone(sels), resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.capacity[%q].%s.compareTo(quantity(%q)) == 0`, driver.Name, driver.CapacityMemory, strconv.FormatInt(size, 10)),
				}}),
				Capacity: capacity(mem, s.Cores),
			}
			req.FirstAvailable = append(req.FirstAvailable, sub)
		}
	default:
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: t.Config.ShareClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: s.Count, Selectors: sels, Capacity: capacity(s.Memory, s.Cores)}
	}
	spec := resourceapi.ResourceClaimTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelManaged: "true"}},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: append([]resourceapi.DeviceRequest{req}, more...)}},
	}
	if s.HasPriority {
		raw, err := json.Marshal(priorityConfig(s.Priority))
		if err != nil {
			return resourceapi.ResourceClaimTemplateSpec{}, fmt.Errorf("encoding the priority config: %w", err)
		}
		spec.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{RequestName},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driver.Name, Parameters: runtime.RawExtension{Raw: raw},
			}},
		}}
	}
	return spec, nil
}

// percentOfMemory is pct percent of a GPU's memory, rounded down to whole
// MiB (the share class's memory step): shares are counted in whole MiB,
// and rounding each up would make shares whose percentages add up to 100
// exceed the GPU (40 % + 60 % of 48 GiB: 19661 + 29492 MiB > 49152 MiB),
// where HAMi puts them on one GPU. Rounded down, they add up to at most
// the GPU's memory.
func percentOfMemory(size, pct int64) int64 {
	const mib = 1 << 20
	mem := size / mib * pct / 100 * mib
	return max(mem, mib)
}

func capacity(mem, cores int64) *resourceapi.CapacityRequirements {
	if mem == 0 && cores == 0 {
		return nil
	}
	r := map[resourceapi.QualifiedName]resource.Quantity{}
	if mem > 0 {
		r[driver.CapacityMemory] = *resource.NewQuantity(mem, resource.BinarySI)
	}
	if cores > 0 {
		r[driver.CapacityCores] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return &resourceapi.CapacityRequirements{Requests: r}
}
