package planner

import (
	"fmt"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/validation/field"
)

// ForeignRequest is a request of a gpulink claim for another driver's
// devices (RDMA NICs next to the GPUs, say): Count devices of the node
// that match the class's and the request's CEL selectors, tolerate the
// devices' NoSchedule and NoExecute taints, are held by no claim and
// satisfy the claim's constraints with the GPUs chosen. gpulink allocates
// such a claim whole, as kube-scheduler's structured allocator would,
// for the parts of the API it can evaluate exactly (foreignRequests says
// which).
type ForeignRequest struct {
	ResultName  string
	Class       *resourceapi.DeviceClass
	Selectors   []string
	Count       int
	Tolerations []resourceapi.DeviceToleration
}

// MaxForeignCount bounds the devices one request for another driver's
// devices may ask for, as topology.MaxGPUs bounds GPU requests.
const MaxForeignCount = 64

// foreignPending is a request whose classes select other drivers' devices,
// as Interpret met it.
type foreignPending struct {
	path           *field.Path
	firstAvailable bool
	subs           []subRequest
	classes        []*resourceapi.DeviceClass
}

// foreignRequests turns the requests for other drivers' devices of a
// claim that also asks for gpulink's into ForeignRequests, or names the
// field gpulink cannot evaluate exactly: it is then reported, never
// ignored.
func (ip *Interpreter) foreignRequests(ic *Claim, pending []foreignPending) error {
	for _, rs := range ic.Requests {
		for _, alt := range rs.Alternatives {
			if alt.MIG {
				return field.Invalid(field.NewPath("spec", "devices", "requests"), alt.ResultName,
					"the claim asks for MIG devices and other drivers' devices; gpulink plans MIG devices apart, so ask for the other devices with whole GPUs or shares, or in a claim of their own")
			}
		}
	}
	for _, fp := range pending {
		if fp.firstAvailable {
			return field.Forbidden(fp.path.Child("firstAvailable"), fmt.Sprintf("request %s asks for other drivers' devices (DeviceClass %s) in a claim with gpulink devices; gpulink allocates such claims with exactly requests only",
				fp.subs[0].resultName, fp.classes[0].Name))
		}
		fr, err := ip.foreignRequest(fp.subs[0], fp.classes[0])
		if err != nil {
			return err
		}
		ic.Foreign = append(ic.Foreign, fr)
	}
	return nil
}

// foreignRequest checks one exactly request for other drivers' devices.
func (ip *Interpreter) foreignRequest(s subRequest, class *resourceapi.DeviceClass) (*ForeignRequest, error) {
	fr := &ForeignRequest{ResultName: s.resultName, Class: class, Tolerations: s.tolerations}
	if len(class.Spec.Selectors) == 0 {
		// Such a class selects every driver's devices, gpulink's too,
		// and kube-scheduler would weigh them all.
		return nil, field.Invalid(s.path.Child("deviceClassName"), class.Name,
			"the DeviceClass has no selectors, so it selects every driver's devices; in a claim with gpulink devices, other drivers' devices need a class that selects them by CEL")
	}
	if kind := ip.cel.ComputeDomainClass(class); kind != "" {
		// A ComputeDomain's devices come with its own claim and config,
		// which kube-scheduler and NVIDIA's driver allocate and prepare.
		return nil, field.Forbidden(s.path.Child("deviceClassName"), fmt.Sprintf("DeviceClass %s selects ComputeDomain %s devices (driver %s), which gpulink never allocates; claim the channel in a claim of its own (the ComputeDomain's resourceClaimTemplate) next to the claim of gpulink devices",
			class.Name, kind, ComputeDomainDriver))
	}
	if s.adminAccess != nil && *s.adminAccess {
		return nil, field.Forbidden(s.path.Child("adminAccess"), fmt.Sprintf("gpulink does not allocate admin access to other drivers' devices (DeviceClass %s); ask for them in a claim of their own", class.Name))
	}
	if s.derived > 0 {
		return nil, field.Forbidden(s.path.Child("derivedAttributes"), "derived attributes (alpha) are not supported by gpulink")
	}
	if s.capacity != nil && len(s.capacity.Requests) > 0 {
		var names []string
		for n := range s.capacity.Requests {
			names = append(names, string(n))
		}
		return nil, field.Forbidden(s.path.Child("capacity", "requests"), fmt.Sprintf("gpulink does not consume capacity (%s) of other drivers' devices (DeviceClass %s); ask for whole devices, or for them in a claim of their own",
			strings.Join(names, ","), class.Name))
	}
	for _, sel := range class.Spec.Selectors {
		// ClassSelectsGpulink refused classes with other selectors.
		fr.Selectors = append(fr.Selectors, sel.CEL.Expression)
	}
	for i, sel := range s.selectors {
		if sel.CEL == nil {
			return nil, field.Required(s.path.Child("selectors").Index(i).Child("cel"), "gpulink understands CEL selectors only")
		}
		if _, err := ip.cel.compile(sel.CEL.Expression); err != nil {
			return nil, field.Invalid(s.path.Child("selectors").Index(i).Child("cel", "expression"), sel.CEL.Expression, err.Error())
		}
		fr.Selectors = append(fr.Selectors, sel.CEL.Expression)
	}
	switch s.mode {
	case "", resourceapi.DeviceAllocationModeExactCount:
		fr.Count = int(s.count)
		if s.count == 0 {
			fr.Count = 1
		}
		if s.count < 0 || s.count > MaxForeignCount {
			return nil, field.Invalid(s.path.Child("count"), s.count, fmt.Sprintf("must be between 1 and %d", MaxForeignCount))
		}
	default:
		return nil, field.NotSupported(s.path.Child("allocationMode"), s.mode, []resourceapi.DeviceAllocationMode{resourceapi.DeviceAllocationModeExactCount})
	}
	for i, t := range s.tolerations {
		if t.Operator != "" && t.Operator != resourceapi.DeviceTolerationOpExists && t.Operator != resourceapi.DeviceTolerationOpEqual {
			return nil, field.NotSupported(s.path.Child("tolerations").Index(i).Child("operator"), t.Operator,
				[]resourceapi.DeviceTolerationOperator{resourceapi.DeviceTolerationOpExists, resourceapi.DeviceTolerationOpEqual})
		}
	}
	return fr, nil
}

// describe renders a foreign request for events: "2 free devices of
// DeviceClass rdma.example.com".
func (fr *ForeignRequest) describe() string {
	s := fmt.Sprintf("%d free devices of DeviceClass %s", fr.Count, fr.Class.Name)
	if fr.Count == 1 {
		s = "1 free device of DeviceClass " + fr.Class.Name
	}
	if len(fr.Selectors) > len(fr.Class.Spec.Selectors) {
		s += " matching the request's selectors"
	}
	return s
}

// wantsForeign tells whether any pending claim asks for other drivers'
// devices.
func wantsForeign(pending []*Claim) bool {
	for _, ic := range pending {
		if len(ic.Foreign) > 0 {
			return true
		}
	}
	return false
}
