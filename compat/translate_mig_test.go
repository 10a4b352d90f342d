package compat

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
)

// nvidia.com/mig-<profile>: N becomes N MIG devices of that profile from
// the MIG class, the resource taken off the container.
func TestTranslateMIG(t *testing.T) {
	tr := Translator{Config: DefaultConfig()}
	r, err := tr.Translate(podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "2", "cpu": "1"})))
	if err != nil || r == nil {
		t.Fatalf("translate: %+v %v", r, err)
	}
	req := request(t, r, "a")
	e := req.Exactly
	if req.Name != RequestName || e == nil || e.DeviceClassName != driver.DeviceClassMIG || e.Count != 2 || e.Capacity != nil {
		t.Fatalf("request %+v, want 2 devices of class %s", req, driver.DeviceClassMIG)
	}
	if len(e.Selectors) != 1 || e.Selectors[0].CEL.Expression != `device.attributes["gpu.gpulink.dev"].profile == "1g.10gb"` {
		t.Errorf("selectors %+v, want the profile 1g.10gb", e.Selectors)
	}
	c := r.Pod.Spec.Containers[0]
	if _, left := c.Resources.Limits["nvidia.com/mig-1g.10gb"]; left || c.Resources.Limits.Cpu().String() != "1" {
		t.Errorf("limits after translation %v, want cpu only", c.Resources.Limits)
	}
	if len(r.Pod.Spec.SchedulingGates) != 1 || !strings.Contains(r.Pod.Annotations[AnnotationTranslated], "MIG devices 2 1g.10gb") {
		t.Errorf("pod gates %v, annotation %q", r.Pod.Spec.SchedulingGates, r.Pod.Annotations[AnnotationTranslated])
	}
	// The leader accepts the translation's template (CheckTemplateEntry).
	for name, spec := range r.Templates {
		if err := tr.Config.CheckTemplateEntry(name, spec.Spec); err != nil {
			t.Errorf("translated MIG template refused: %v", err)
		}
	}
}

// Several profiles in one container: one request each, sorted by profile,
// named gpu, gpu-1, ...; the template passes the leader's check.
func TestTranslateMIGSeveralProfiles(t *testing.T) {
	tr := Translator{Config: DefaultConfig()}
	r, err := tr.Translate(podWith(ctr("a", map[string]string{"nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "1"})))
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Templates) != 1 {
		t.Fatalf("%d templates, want 1", len(r.Templates))
	}
	for name, spec := range r.Templates {
		reqs := spec.Spec.Devices.Requests
		if len(reqs) != 2 || reqs[0].Name != "gpu" || reqs[1].Name != "gpu-1" ||
			!strings.Contains(reqs[0].Exactly.Selectors[0].CEL.Expression, `"1g.10gb"`) || !strings.Contains(reqs[1].Exactly.Selectors[0].CEL.Expression, `"3g.40gb"`) {
			t.Errorf("requests %+v, want gpu=1g.10gb and gpu-1=3g.40gb", reqs)
		}
		if err := tr.Config.CheckTemplateEntry(name, spec.Spec); err != nil {
			t.Errorf("translated template refused: %v", err)
		}
		forged := spec.Spec.DeepCopy()
		forged.Devices.Requests[1].Exactly.Capacity = &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{"memory": resource.MustParse("1Gi")}}
		if err := tr.Config.CheckTemplateEntry(mustName(t, *forged), *forged); err == nil || !strings.Contains(err.Error(), "devices.requests[1].exactly.capacity") {
			t.Errorf("forged MIG template with capacity: %v", err)
		}
		forged = spec.Spec.DeepCopy()
		forged.Devices.Requests[1].Exactly.DeviceClassName = driver.DeviceClassWhole
		if err := tr.Config.CheckTemplateEntry(mustName(t, *forged), *forged); err == nil || !strings.Contains(err.Error(), driver.DeviceClassWhole) {
			t.Errorf("forged MIG template with a whole-GPU request: %v", err)
		}
	}
}

// The translated selector matches a MIG device of the profile only.
func TestMIGProfileSelectorMatches(t *testing.T) {
	prog := dracel.GetCompiler(dracel.Features{}).CompileCELExpression(MIGProfileSelector("1g.10gb"), dracel.Options{})
	if prog.Error != nil {
		t.Fatal(prog.Error)
	}
	for profile, want := range map[string]bool{"1g.10gb": true, "1g.10gb-me": false, "2g.20gb": false} {
		d := dracel.Device{Driver: driver.Name, Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{driver.AttrMIGProfile: {StringValue: ptr.To(profile)}}}
		if got, _, err := prog.DeviceMatches(context.Background(), d); err != nil || got != want {
			t.Errorf("profile %s: match %v (%v), want %v", profile, got, err, want)
		}
	}
}

// Bad MIG values are refused naming the resource and the value.
func TestTranslateMIGRefused(t *testing.T) {
	tr := Translator{Config: DefaultConfig()}
	for name, tc := range map[string]struct {
		pod  *corev1.Pod
		want []string
	}{
		"not a profile":    {podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gbx": "1"})), []string{"nvidia.com/mig-1g.10gbx", `"1g.10gbx"`, "not a MIG profile name"}},
		"no memory":        {podWith(ctr("a", map[string]string{"nvidia.com/mig-3g": "1"})), []string{"nvidia.com/mig-3g", `"3g"`}},
		"fraction":         {podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "500m"})), []string{"nvidia.com/mig-1g.10gb", "500m", "whole number"}},
		"negative":         {podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "-1"})), []string{"nvidia.com/mig-1g.10gb", "-1"}},
		"too many":         {podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "65"})), []string{"nvidia.com/mig-1g.10gb: 65"}},
		"with whole GPUs":  {podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "1", "nvidia.com/gpu": "1"})), []string{"nvidia.com/mig-1g.10gb: 1", "nvidia.com/gpu: 1", "one kind"}},
		"with a priority":  {podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "1", "nvidia.com/priority": "0"})), []string{"nvidia.com/priority: 0", "nvidia.com/mig-1g.10gb: 1"}},
		"bad profile zero": {podWith(ctr("a", map[string]string{"nvidia.com/mig-x": "0"})), []string{"nvidia.com/mig-x", `"x"`}},
	} {
		r, err := tr.Translate(tc.pod)
		if err == nil {
			t.Errorf("%s: translated %+v", name, r)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not mention %q", name, err, w)
			}
		}
	}
	// Containers of one pod may differ: each gets its own claim of its kind.
	r, err := tr.Translate(podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "1"}), ctr("b", map[string]string{"nvidia.com/gpu": "1"})))
	if err != nil || len(r.Claims) != 2 {
		t.Fatalf("MIG and whole-GPU containers: %+v %v", r, err)
	}
	if a, b := request(t, r, "a"), request(t, r, "b"); a.Exactly.DeviceClassName != driver.DeviceClassMIG || b.Exactly.DeviceClassName != driver.DeviceClassWhole {
		t.Errorf("classes %s and %s, want %s and %s", a.Exactly.DeviceClassName, b.Exactly.DeviceClassName, driver.DeviceClassMIG, driver.DeviceClassWhole)
	}
	// A zero count of a valid profile asks for nothing, as nvidia.com/gpu: 0.
	r, err = tr.Translate(podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "0"})))
	if err != nil || len(r.Claims) != 0 {
		t.Fatalf("zero count: %+v %v", r, err)
	}
	if _, left := r.Pod.Spec.Containers[0].Resources.Limits["nvidia.com/mig-1g.10gb"]; left {
		t.Error("zero count left on the container")
	}
}

// MIG translation is configuration: off, nvidia.com/mig-* is left alone;
// the prefix may be renamed; a name under the prefix is refused.
func TestMIGConfig(t *testing.T) {
	if got := (&Translator{Config: DefaultConfig()}).ResourcePrefixes(); len(got) != 1 || got[0] != "nvidia.com/mig-" {
		t.Errorf("default prefixes %v", got)
	}
	off, err := Decode([]byte(`nvidia: {enabled: true}`))
	if err != nil {
		t.Fatal(err)
	}
	tr := Translator{Config: off}
	if r, err := tr.Translate(podWith(ctr("a", map[string]string{"nvidia.com/mig-1g.10gb": "1"}))); r != nil || err != nil {
		t.Errorf("MIG off: translated %+v %v", r, err)
	}
	renamed, err := Decode([]byte(`nvidia: {enabled: true, mig: true, migPrefix: example.com/mig-}`))
	if err != nil {
		t.Fatal(err)
	}
	tr = Translator{Config: renamed}
	if r, err := tr.Translate(podWith(ctr("a", map[string]string{"example.com/mig-2g.20gb": "1"}))); err != nil || len(r.Claims) != 1 {
		t.Errorf("renamed prefix: %+v %v", r, err)
	}
	for name, c := range map[string][]string{
		"bad prefix":      {`nvidia: {enabled: true, mig: true, migPrefix: "nvidia.com/"}`, "nvidia.migPrefix", `"nvidia.com/"`},
		"name in prefix":  {`nvidia: {enabled: true, mig: true, gpu: nvidia.com/mig-all}`, "nvidia.gpu", `"nvidia.com/mig-all"`},
		"bad MIG class":   {`migClass: "Not_A_Class"`, "migClass", "Not_A_Class"},
		"prefix no slash": {`nvidia: {enabled: true, mig: true, migPrefix: "mig-"}`, "nvidia.migPrefix"},
	} {
		_, err := Decode([]byte(c[0]))
		if err == nil {
			t.Errorf("%s: accepted", name)
			continue
		}
		for _, w := range c[1:] {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %q does not mention %q", name, err, w)
			}
		}
	}
}
