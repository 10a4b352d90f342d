package compat

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"sort"

	resourceapi "k8s.io/api/resource/v1"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
)

// AnnotationTemplates on a translated pod holds the ResourceClaimTemplates
// the pod needs, as a JSON object from template name to claim spec. The
// webhook writes it and creates nothing (it must be free of side effects:
// anyone who reaches its port could call it); the controller's leader
// creates the templates for pods that exist, in the pod's namespace, after
// checking each entry with CheckTemplateEntry.
const AnnotationTemplates = "gpu.gpulink.dev/compat-templates"

// EncodeTemplates is the AnnotationTemplates value for a translation's
// templates.
func EncodeTemplates(templates map[string]resourceapi.ResourceClaimTemplateSpec) (string, error) {
	specs := make(map[string]resourceapi.ResourceClaimSpec, len(templates))
	for name, t := range templates {
		specs[name] = t.Spec
	}
	b, err := json.Marshal(specs)
	if err != nil {
		return "", fmt.Errorf("encoding annotation %s: %w", AnnotationTemplates, err)
	}
	return string(b), nil
}

// DecodeTemplates reads an AnnotationTemplates value strictly: unknown
// fields are an error, since a spec the leader cannot read completely
// would be created as something else than it says.
func DecodeTemplates(value string) (map[string]resourceapi.ResourceClaimSpec, error) {
	var specs map[string]resourceapi.ResourceClaimSpec
	if err := strictUnmarshal([]byte(value), &specs); err != nil {
		return nil, fmt.Errorf("annotation %s: %w", AnnotationTemplates, err)
	}
	return specs, nil
}

// SpecCapacities returns the capacities (driver.CapacityMemory,
// driver.CapacityCores) a claim spec's requests ask for, sorted, each once.
func SpecCapacities(spec resourceapi.ResourceClaimSpec) []resourceapi.QualifiedName {
	var out []resourceapi.QualifiedName
	add := func(c *resourceapi.CapacityRequirements) {
		if c != nil {
			for n := range c.Requests {
				out = append(out, n)
			}
		}
	}
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil {
			add(r.Exactly.Capacity)
		}
		for _, s := range r.FirstAvailable {
			add(s.Capacity)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// SpecClasses returns the DeviceClasses a claim spec asks devices of,
// sorted, each once.
func SpecClasses(spec resourceapi.ResourceClaimSpec) []string {
	var out []string
	for _, r := range spec.Devices.Requests {
		if r.Exactly != nil {
			out = append(out, r.Exactly.DeviceClassName)
		}
		for _, s := range r.FirstAvailable {
			out = append(out, s.DeviceClassName)
		}
	}
	sort.Strings(out)
	return slices.Compact(out)
}

// CheckTemplateEntry checks one entry of AnnotationTemplates before the
// leader creates its template: the name is the spec's hash (so a forged
// entry cannot put a spec under another shape's name), and the spec has
// the form the translation gives (one request named RequestName, of the
// configured whole or share class, exact counts, no admin access,
// tolerations or constraints, and no config but the one carrying a task
// priority, sharing.priority alone), so that a pod carrying a forged
// annotation gets nothing a translated pod could not get. Errors name the
// field and its value.
func (c *Config) CheckTemplateEntry(name string, spec resourceapi.ResourceClaimSpec) error {
	if !IsTemplateName(name) {
		return fmt.Errorf("template name %q does not start with %s", name, TemplatePrefix)
	}
	if err := CheckTemplateName(name, spec); err != nil {
		return fmt.Errorf("template %s: %w", name, err)
	}
	var errs []error
	d := spec.Devices
	if len(d.Constraints) > 0 {
		errs = append(errs, fmt.Errorf("devices.constraints has %d entries, want none", len(d.Constraints)))
	}
	switch len(d.Config) {
	case 0:
	case 1:
		errs = append(errs, checkPriorityConfig(d.Config[0]))
	default:
		errs = append(errs, fmt.Errorf("devices.config has %d entries, want at most 1 (a task priority)", len(d.Config)))
	}
	switch {
	case c.isMIGSpec(spec):
		// One request per MIG profile, named as migRequestName names
		// them, each exactly of the MIG class; no config.
		if len(d.Config) > 0 {
			errs = append(errs, fmt.Errorf("devices.config has %d entries, want none for MIG devices", len(d.Config)))
		}
		for i, r := range d.Requests {
			errs = append(errs, c.checkMIGRequest(i, r))
		}
	case len(d.Requests) != 1:
		errs = append(errs, fmt.Errorf("devices.requests has %d entries, want 1", len(d.Requests)))
	default:
		errs = append(errs, c.checkRequest(d.Requests[0]))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("template %s is not a translation's: %w", name, err)
	}
	return nil
}

func (c *Config) checkRequest(r resourceapi.DeviceRequest) error {
	var errs []error
	if r.Name != RequestName {
		errs = append(errs, fmt.Errorf("devices.requests[0].name %q, want %q", r.Name, RequestName))
	}
	type sub struct {
		path        string
		class       string
		mode        resourceapi.DeviceAllocationMode
		adminAccess *bool
		tolerations int
		allowed     []string
	}
	var subs []sub
	switch {
	case r.Exactly != nil && len(r.FirstAvailable) > 0:
		errs = append(errs, errors.New("devices.requests[0] has both exactly and firstAvailable"))
	case r.Exactly != nil:
		e := r.Exactly
		subs = append(subs, sub{"devices.requests[0].exactly", e.DeviceClassName, e.AllocationMode, e.AdminAccess, len(e.Tolerations), []string{c.WholeClass, c.ShareClass}})
	case len(r.FirstAvailable) > 0:
		for i, s := range r.FirstAvailable {
			subs = append(subs, sub{fmt.Sprintf("devices.requests[0].firstAvailable[%d]", i), s.DeviceClassName, s.AllocationMode, nil, len(s.Tolerations), []string{c.ShareClass}})
		}
	default:
		errs = append(errs, errors.New("devices.requests[0] has neither exactly nor firstAvailable"))
	}
	for _, s := range subs {
		if !slices.Contains(s.allowed, s.class) {
			errs = append(errs, fmt.Errorf("%s.deviceClassName %q, want one of %q", s.path, s.class, s.allowed))
		}
		if s.mode != "" && s.mode != resourceapi.DeviceAllocationModeExactCount {
			errs = append(errs, fmt.Errorf("%s.allocationMode %q, want %q", s.path, s.mode, resourceapi.DeviceAllocationModeExactCount))
		}
		if s.adminAccess != nil && *s.adminAccess {
			errs = append(errs, fmt.Errorf("%s.adminAccess true, want unset", s.path))
		}
		if s.tolerations > 0 {
			errs = append(errs, fmt.Errorf("%s.tolerations has %d entries, want none", s.path, s.tolerations))
		}
	}
	return errors.Join(errs...)
}

// isMIGSpec tells whether a template asks for MIG devices: its first
// request is of the MIG class.
func (c *Config) isMIGSpec(spec resourceapi.ResourceClaimSpec) bool {
	r := spec.Devices.Requests
	return len(r) > 0 && r[0].Exactly != nil && r[0].Exactly.DeviceClassName == c.MIGClass
}

// checkMIGRequest checks request i of a MIG template.
func (c *Config) checkMIGRequest(i int, r resourceapi.DeviceRequest) error {
	path := fmt.Sprintf("devices.requests[%d]", i)
	if want := migRequestName(i); r.Name != want {
		return fmt.Errorf("%s.name %q, want %q", path, r.Name, want)
	}
	e := r.Exactly
	switch {
	case e == nil || len(r.FirstAvailable) > 0:
		return fmt.Errorf("%s: want exactly, without firstAvailable", path)
	case e.DeviceClassName != c.MIGClass:
		return fmt.Errorf("%s.exactly.deviceClassName %q, want %q", path, e.DeviceClassName, c.MIGClass)
	case e.AllocationMode != "" && e.AllocationMode != resourceapi.DeviceAllocationModeExactCount:
		return fmt.Errorf("%s.exactly.allocationMode %q, want %q", path, e.AllocationMode, resourceapi.DeviceAllocationModeExactCount)
	case e.AdminAccess != nil && *e.AdminAccess:
		return fmt.Errorf("%s.exactly.adminAccess true, want unset", path)
	case len(e.Tolerations) > 0:
		return fmt.Errorf("%s.exactly.tolerations has %d entries, want none", path, len(e.Tolerations))
	case e.Capacity != nil:
		return fmt.Errorf("%s.exactly.capacity is set, want unset for MIG devices", path)
	}
	return nil
}

// checkPriorityConfig accepts the one config entry the translation
// writes: for request RequestName, opaque for this driver, a GpuConfig
// with a valid sharing.priority and nothing else, so a forged entry cannot
// set any other field of the claim's config.
func checkPriorityConfig(c resourceapi.DeviceClaimConfiguration) error {
	const path = "devices.config[0]"
	if !slices.Equal(c.Requests, []string{RequestName}) {
		return fmt.Errorf("%s.requests %q, want [%q]", path, c.Requests, RequestName)
	}
	if c.Opaque == nil || c.Opaque.Driver != driver.Name {
		return fmt.Errorf("%s is not an opaque config of driver %s", path, driver.Name)
	}
	got, err := v1alpha1.Decode(c.Opaque.Parameters.Raw)
	if err != nil {
		return fmt.Errorf("%s.opaque.parameters: %w", path, err)
	}
	if got.Sharing == nil || got.Sharing.Priority == nil {
		return fmt.Errorf("%s.opaque.parameters sets no sharing.priority, the only config a translation writes", path)
	}
	if err := got.Validate(); err != nil {
		return fmt.Errorf("%s.opaque.parameters: %w", path, err)
	}
	if want := priorityConfig(*got.Sharing.Priority); !reflect.DeepEqual(got, &want) {
		return fmt.Errorf("%s.opaque.parameters sets more than sharing.priority, the only config a translation writes", path)
	}
	return nil
}

// strictUnmarshal decodes one JSON value, refusing unknown fields and
// trailing data.
func strictUnmarshal(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data after the JSON object")
	}
	return nil
}
