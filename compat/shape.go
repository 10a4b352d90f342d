package compat

// Reading what a container asks for (Shape) from its device-plugin resources.

import (
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
)

// value reads one extended resource of a container: limits, else
// requests (extended resources cannot be over-committed, so both must
// agree), as a non-negative integer.
func value(r *corev1.ResourceRequirements, name string) (int64, bool, error) {
	n := corev1.ResourceName(name)
	lim, hasLim := r.Limits[n]
	req, hasReq := r.Requests[n]
	if !hasLim && !hasReq {
		return 0, false, nil
	}
	q := lim
	if !hasLim {
		q = req
	} else if hasReq && req.Cmp(lim) != 0 {
		return 0, true, fmt.Errorf("%s: requests %s differ from limits %s (an extended resource cannot be over-committed)", name, req.String(), lim.String())
	}
	if q.Sign() < 0 {
		return 0, true, fmt.Errorf("%s: %s is negative", name, q.String())
	}
	v, ok := q.AsInt64()
	if !ok {
		return 0, true, fmt.Errorf("%s: %s is not a whole number", name, q.String())
	}
	return v, true, nil
}

// shape reads what a container asks for; ok is false when it asks for
// nothing this configuration translates.
func (t *Translator) shape(c *corev1.Container) (Shape, bool, error) {
	type val struct {
		name string
		v    int64
		set  bool
	}
	var errs []error
	read := func(name string) val {
		v, set, err := value(&c.Resources, name)
		if err != nil {
			errs = append(errs, err)
		}
		return val{name, v, set}
	}
	var families []Shape
	var used []string
	cfg := t.Config
	if cfg.NVIDIA.Enabled {
		gpu, mem, pct, cores := read(cfg.NVIDIA.GPU), read(cfg.NVIDIA.Memory), read(cfg.NVIDIA.MemoryPercentage), read(cfg.NVIDIA.Cores)
		prio := read(cfg.NVIDIA.Priority)
		var mig Shape
		var migOK bool
		if cfg.NVIDIA.MIG {
			var err error
			if mig, migOK, err = t.migShape(c); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			s, ok, err := t.nvidia(gpu.v, gpu.set, mem.v, mem.set, pct.v, pct.set, cores.v, cores.set)
			switch {
			case err == nil && migOK && ok:
				err = fmt.Errorf("asks for MIG devices (%s) and for whole GPUs or shares (%s) together; a container gets one kind", mig.From, s.From)
			case err == nil && migOK && prio.set:
				err = fmt.Errorf("%s: %d with MIG devices (%s): a task priority orders the work of a shared GPU and a MIG device is never shared; drop it", cfg.NVIDIA.Priority, prio.v, mig.From)
			case err == nil && migOK:
				s, ok = mig, true
			case err == nil && prio.set:
				s, ok, err = t.withPriority(s, ok, prio.v)
			}
			if err != nil {
				errs = append(errs, err)
			} else if ok {
				families = append(families, s)
				used = append(used, "nvidia")
			}
		}
	}
	if cfg.Aliyun.Enabled {
		gpu := read(cfg.Aliyun.GPU)
		if len(errs) == 0 && gpu.set && gpu.v > 0 {
			families = append(families, Shape{Count: gpu.v, From: fmt.Sprintf("%s: %d", gpu.name, gpu.v)})
			used = append(used, "aliyun")
		}
	}
	if cfg.Tencent.Enabled {
		cores, mem := read(cfg.Tencent.Cores), read(cfg.Tencent.Memory)
		if len(errs) == 0 {
			s, ok, err := t.tencent(cores.v, cores.set, mem.v, mem.set)
			if err != nil {
				errs = append(errs, err)
			} else if ok {
				families = append(families, s)
				used = append(used, "tencent")
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Shape{}, false, err
	}
	switch len(families) {
	case 0:
		return Shape{}, false, nil
	case 1:
		s := families[0]
		return s, true, t.checkInventory(s)
	default:
		return Shape{}, false, fmt.Errorf("asks for GPUs through more than one device-plugin family (%s: %s); use one", strings.Join(used, ", "), families[0].From+"; "+families[1].From)
	}
}

func (t *Translator) nvidia(gpu int64, gpuSet bool, mem int64, memSet bool, pct int64, pctSet bool, cores int64, coresSet bool) (Shape, bool, error) {
	n := t.Config.NVIDIA
	share := memSet || pctSet || coresSet
	var from []string
	if gpuSet {
		from = append(from, fmt.Sprintf("%s: %d", n.GPU, gpu))
	}
	if memSet {
		from = append(from, fmt.Sprintf("%s: %d", n.Memory, mem))
	}
	if pctSet {
		from = append(from, fmt.Sprintf("%s: %d", n.MemoryPercentage, pct))
	}
	if coresSet {
		from = append(from, fmt.Sprintf("%s: %d", n.Cores, cores))
	}
	if !gpuSet && !share {
		return Shape{}, false, nil
	}
	s := Shape{Count: gpu, Share: share, From: strings.Join(from, ", ")}
	if !gpuSet {
		// HAMi's default when only memory or cores are given: one GPU.
		s.Count = 1
	}
	if gpuSet && gpu == 0 {
		if share {
			return Shape{}, false, fmt.Errorf("%s: 0 with %s: a share needs at least one GPU", n.GPU, s.From)
		}
		return Shape{}, false, nil
	}
	if !share {
		return s, true, nil
	}
	var errs []error
	if memSet && pctSet {
		errs = append(errs, fmt.Errorf("%s: %d and %s: %d both size the memory; use one", n.Memory, mem, n.MemoryPercentage, pct))
	}
	if memSet {
		if mem <= 0 {
			errs = append(errs, fmt.Errorf("%s: %d must be positive", n.Memory, mem))
		}
		unit := n.MemoryUnit.Value()
		if mem > (1<<62)/unit {
			errs = append(errs, fmt.Errorf("%s: %d is too large", n.Memory, mem))
		}
		s.Memory = mem * unit
	}
	if pctSet {
		if pct < 1 || pct > 100 {
			errs = append(errs, fmt.Errorf("%s: %d must be between 1 and 100", n.MemoryPercentage, pct))
		}
		s.MemoryPercent = pct
	}
	if coresSet {
		if cores < 1 || cores > 100 {
			errs = append(errs, fmt.Errorf("%s: %d must be between 1 and 100 (percent of one GPU)", n.Cores, cores))
		}
		s.Cores = cores
	}
	return s, true, errors.Join(errs...)
}

// withPriority adds HAMi's task priority to what a container asks for
// (ok). A priority is refused outside 0 and 1, and without a GPU: it asks
// for no device, and left alone it would stay on the pod as an extended
// resource no node has, so the pod would never be scheduled.
func (t *Translator) withPriority(s Shape, ok bool, prio int64) (Shape, bool, error) {
	name := t.Config.NVIDIA.Priority
	if prio != v1alpha1.PriorityHigh && prio != v1alpha1.PriorityLow {
		return Shape{}, false, fmt.Errorf("%s: %d must be 0 (high) or 1 (low)", name, prio)
	}
	if !ok {
		n := t.Config.NVIDIA
		return Shape{}, false, fmt.Errorf("%s: %d without a GPU (%s, %s, %s or %s): a task priority orders GPU work, so ask for a GPU or drop it", name, prio, n.GPU, n.Memory, n.MemoryPercentage, n.Cores)
	}
	s.Priority, s.HasPriority = int(prio), true
	s.From += fmt.Sprintf(", %s: %d", name, prio)
	return s, true, nil
}

// priorityName is how the translation's summary names a priority.
func priorityName(p int) string {
	if p == v1alpha1.PriorityHigh {
		return "priority 0 (high)"
	}
	return "priority 1 (low)"
}

// priorityConfig is the opaque config a translated template carries for a
// task priority: a GpuConfig with sharing.priority alone, so the claim
// keeps its class's every other setting.
func priorityConfig(prio int) v1alpha1.GpuConfig {
	c := v1alpha1.GpuConfig{Sharing: &v1alpha1.SharingConfig{Priority: &prio}}
	c.APIVersion, c.Kind = v1alpha1.APIVersion, v1alpha1.Kind
	return c
}

func (t *Translator) tencent(cores int64, coresSet bool, mem int64, memSet bool) (Shape, bool, error) {
	n := t.Config.Tencent
	from := fmt.Sprintf("%s: %d", n.Cores, cores)
	if memSet {
		from += fmt.Sprintf(", %s: %d", n.Memory, mem)
	}
	switch {
	case !coresSet && !memSet:
		return Shape{}, false, nil
	case !coresSet:
		return Shape{}, false, fmt.Errorf("%s: %d without %s: gpu-manager needs both", n.Memory, mem, n.Cores)
	case cores == 0 && memSet:
		return Shape{}, false, fmt.Errorf("%s: 0 with %s: %d: a share needs cores", n.Cores, n.Memory, mem)
	case cores == 0:
		return Shape{}, false, nil
	case cores%100 == 0:
		// gpu-manager gives whole GPUs for multiples of 100 and their
		// memory with them; vcuda-memory does not limit them.
		return Shape{Count: cores / 100, From: from}, true, nil
	case cores > 100:
		return Shape{}, false, fmt.Errorf("%s: %d: above 100 it must be a multiple of 100 (whole GPUs)", n.Cores, cores)
	}
	s := Shape{Count: 1, Share: true, Cores: cores, From: from}
	if memSet {
		if mem <= 0 {
			return Shape{}, false, fmt.Errorf("%s: %d must be positive", n.Memory, mem)
		}
		unit := n.MemoryUnit.Value()
		if mem > (1<<62)/unit {
			return Shape{}, false, fmt.Errorf("%s: %d is too large", n.Memory, mem)
		}
		s.Memory = mem * unit
	}
	return s, true, nil
}
