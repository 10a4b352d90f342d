package compat

import (
	"encoding/json"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
)

func wholeSpec(count int64) resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: RequestName,
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole,
			AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: count},
	}}}}
}

func mustName(t *testing.T, spec resourceapi.ResourceClaimSpec) string {
	t.Helper()
	n, err := TemplateName(spec)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// The name does not change when the API server's defaults are applied, nor
// with the encodings the API server may return for the same spec (nil or
// empty slices, quantities in another notation, map order).
func TestTemplateNameStableUnderDefaultsAndEncoding(t *testing.T) {
	base := mustName(t, wholeSpec(1))
	if !strings.HasPrefix(base, TemplatePrefix) || len(base) != len(TemplatePrefix)+templateHashLen {
		t.Fatalf("name %q: want %s and %d hex digits", base, TemplatePrefix, templateHashLen)
	}

	// What a user writes without defaults is what the API server stores
	// with them: no allocationMode, no count.
	bare := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
		Name: RequestName, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole},
	}}}}
	if got := mustName(t, bare); got != base {
		t.Errorf("undefaulted 1-GPU spec named %s, defaulted %s", got, base)
	}
	// Empty vs nil slices and selectors.
	empty := wholeSpec(1)
	empty.Devices.Constraints = []resourceapi.DeviceConstraint{}
	empty.Devices.Config = []resourceapi.DeviceClaimConfiguration{}
	empty.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{}
	if got := mustName(t, empty); got != base {
		t.Errorf("spec with empty slices named %s, want %s", got, base)
	}
	// The API server's round trip through JSON keeps the name.
	var back resourceapi.ResourceClaimSpec
	b, _ := json.Marshal(wholeSpec(1))
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got := mustName(t, back); got != base {
		t.Errorf("round-tripped spec named %s, want %s", got, base)
	}

	// Quantities: the translation's (bytes, BinarySI) and the canonical
	// string the API server stores and returns name the same. (Another
	// notation of the same amount, e.g. 3145728000, is stored as written
	// and names another template; the translation never writes one.)
	share := func(mem resource.Quantity) resourceapi.ResourceClaimSpec {
		return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: RequestName, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassShare,
				Capacity: &resourceapi.CapacityRequirements{Requests: map[resourceapi.QualifiedName]resource.Quantity{
					driver.CapacityMemory: mem, driver.CapacityCores: resource.MustParse("30"),
				}}},
		}}}}
	}
	for _, bytes := range []int64{3000 << 20, 40 * gi * 33 / 100, 1} {
		q := resource.NewQuantity(bytes, resource.BinarySI)
		if a, b := mustName(t, share(*q)), mustName(t, share(resource.MustParse(q.String()))); a != b {
			t.Errorf("%d bytes named %s, its canonical string %s named %s", bytes, a, q.String(), b)
		}
	}

	// Tolerations without an operator get Equal, on subrequests too.
	tol := func(op resourceapi.DeviceTolerationOperator) resourceapi.ResourceClaimSpec {
		return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{
			Name: RequestName, FirstAvailable: []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: driver.DeviceClassShare,
				Tolerations: []resourceapi.DeviceToleration{{Key: "k", Value: "v", Operator: op, Effect: resourceapi.DeviceTaintEffectNoSchedule}}}},
		}}}}
	}
	if a, b := mustName(t, tol("")), mustName(t, tol(resourceapi.DeviceTolerationOpEqual)); a != b {
		t.Errorf("toleration without operator named %s, with Equal %s", a, b)
	}
}

// Any difference that matters for allocation changes the name.
func TestTemplateNameDistinguishesSpecs(t *testing.T) {
	seen := map[string]string{}
	add := func(what string, spec resourceapi.ResourceClaimSpec) {
		n := mustName(t, spec)
		if other, dup := seen[n]; dup {
			t.Errorf("%s and %s share the name %s", what, other, n)
		}
		seen[n] = what
	}
	add("1 GPU", wholeSpec(1))
	add("8 GPUs", wholeSpec(8))
	other := wholeSpec(1)
	other.Devices.Requests[0].Exactly.DeviceClassName = "other.example.com"
	add("1 device of another class", other)
	all := wholeSpec(0)
	all.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
	add("all GPUs", all)
	admin := wholeSpec(1)
	admin.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true)
	add("admin access", admin)
	sel := wholeSpec(1)
	sel.Devices.Requests[0].Exactly.Selectors = []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: "true"}}}
	add("with a selector", sel)
	cfg := wholeSpec(1)
	cfg.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{RequestName}}}
	add("with config", cfg)
}

func TestCheckTemplateName(t *testing.T) {
	one, eight := wholeSpec(1), wholeSpec(8)
	name := mustName(t, one)
	if err := CheckTemplateName(name, one); err != nil {
		t.Errorf("own spec: %v", err)
	}
	err := CheckTemplateName(name, eight)
	if err == nil {
		t.Fatal("an 8-GPU spec under the 1-GPU name passed")
	}
	for _, want := range []string{name, mustName(t, eight), "8 device(s) of " + driver.DeviceClassWhole} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not mention %q", err, want)
		}
	}
}

// The translation's templates are named by TemplateName and carried in the
// pod's annotation, which decodes back to the same specs.
func TestTranslationAnnotationCarriesTemplates(t *testing.T) {
	tr := Translator{Config: allFamilies(), Inventory: sizes{40 * gi, 80 * gi}}
	r, err := tr.Translate(podWith(
		ctr("a", map[string]string{"nvidia.com/gpu": "2"}),
		ctr("b", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}),
		ctr("c", map[string]string{"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "20"}),
	))
	if err != nil {
		t.Fatal(err)
	}
	specs, err := DecodeTemplates(r.Pod.Annotations[AnnotationTemplates])
	if err != nil {
		t.Fatal(err)
	}
	if len(specs) != 3 || len(r.Templates) != 3 {
		t.Fatalf("annotation has %d templates, result %d; want 3", len(specs), len(r.Templates))
	}
	cfg := allFamilies()
	for _, c := range r.Claims {
		spec, ok := specs[c.Template]
		if !ok {
			t.Fatalf("container %s: template %s not in the annotation", c.Container, c.Template)
		}
		if err := CheckTemplateName(c.Template, spec); err != nil {
			t.Errorf("container %s: %v", c.Container, err)
		}
		if err := cfg.CheckTemplateEntry(c.Template, spec); err != nil {
			t.Errorf("container %s: the translation's own entry is refused: %v", c.Container, err)
		}
	}
}

func TestDecodeTemplatesStrict(t *testing.T) {
	for _, bad := range []string{`[]`, `{"x": {"devices": {"requests": [], "bogus": 1}}}`, `{"x": {}} {}`, `not json`} {
		if _, err := DecodeTemplates(bad); err == nil || !strings.Contains(err.Error(), AnnotationTemplates) {
			t.Errorf("%s: error %v, want one naming %s", bad, err, AnnotationTemplates)
		}
	}
}

// A forged annotation entry is refused unless it is of the translation's
// form under its own hash name; each error names the field and value.
func TestCheckTemplateEntry(t *testing.T) {
	cfg := DefaultConfig()
	entry := func(mut func(*resourceapi.ResourceClaimSpec)) (string, resourceapi.ResourceClaimSpec) {
		s := wholeSpec(2)
		mut(&s)
		return mustName(t, s), s
	}
	ok := func(*resourceapi.ResourceClaimSpec) {}
	if n, s := entry(ok); cfg.CheckTemplateEntry(n, s) != nil {
		t.Errorf("plain 2-GPU entry refused: %v", cfg.CheckTemplateEntry(n, s))
	}
	withPriority := func(s *resourceapi.ResourceClaimSpec) {
		s.Devices.Config = []resourceapi.DeviceClaimConfiguration{opaque(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":0}}`)}
	}
	if n, s := entry(withPriority); cfg.CheckTemplateEntry(n, s) != nil {
		t.Errorf("entry with a priority refused: %v", cfg.CheckTemplateEntry(n, s))
	}
	n, _ := entry(ok)
	if err := cfg.CheckTemplateEntry(n, wholeSpec(8)); err == nil || !strings.Contains(err.Error(), "hashes to") {
		t.Errorf("8 GPUs under the 2-GPU name: %v", err)
	}
	if err := cfg.CheckTemplateEntry("my-template", wholeSpec(2)); err == nil || !strings.Contains(err.Error(), `"my-template"`) {
		t.Errorf("name outside the prefix: %v", err)
	}
	for _, tc := range []struct {
		mut  func(*resourceapi.ResourceClaimSpec)
		want string
	}{
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Requests[0].Exactly.DeviceClassName = "nic.example.com"
		}, `deviceClassName "nic.example.com"`},
		{func(s *resourceapi.ResourceClaimSpec) { s.Devices.Requests[0].Exactly.AdminAccess = ptr.To(true) }, "adminAccess true"},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Requests[0].Exactly.AllocationMode = resourceapi.DeviceAllocationModeAll
			s.Devices.Requests[0].Exactly.Count = 0
		}, `allocationMode "All"`},
		{func(s *resourceapi.ResourceClaimSpec) { s.Devices.Requests[0].Name = "x" }, `name "x"`},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Requests[0].Exactly.Tolerations = []resourceapi.DeviceToleration{{Operator: resourceapi.DeviceTolerationOpExists}}
		}, "tolerations has 1"},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Config = []resourceapi.DeviceClaimConfiguration{{Requests: []string{RequestName}}}
		}, "devices.config[0] is not an opaque config of driver " + driver.Name},
		// Only sharing.priority may travel in a translated template.
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Config = []resourceapi.DeviceClaimConfiguration{opaque(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":1,"strategy":"None"}}`)}
		}, "sets more than sharing.priority"},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Config = []resourceapi.DeviceClaimConfiguration{opaque(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"maxSharesPerGPU":100}}`)}
		}, "sets no sharing.priority"},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Config = []resourceapi.DeviceClaimConfiguration{opaque(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":2}}`)}
		}, "sharing.priority: Invalid value: 2"},
		{func(s *resourceapi.ResourceClaimSpec) {
			c := opaque(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":1}}`)
			c.Requests = nil
			s.Devices.Config = []resourceapi.DeviceClaimConfiguration{c}
		}, "devices.config[0].requests []"},
		{func(s *resourceapi.ResourceClaimSpec) {
			c := opaque(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"priority":1}}`)
			s.Devices.Config = []resourceapi.DeviceClaimConfiguration{c, c}
		}, "devices.config has 2"},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Constraints = []resourceapi.DeviceConstraint{{MatchAttribute: ptr.To[resourceapi.FullyQualifiedName]("x/y")}}
		}, "devices.constraints has 1"},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Requests = append(s.Devices.Requests, s.Devices.Requests[0])
		}, "devices.requests has 2"},
		{func(s *resourceapi.ResourceClaimSpec) {
			s.Devices.Requests[0].Exactly = nil
			s.Devices.Requests[0].FirstAvailable = []resourceapi.DeviceSubRequest{{Name: "a", DeviceClassName: driver.DeviceClassWhole, Count: 1}}
		}, `firstAvailable[0].deviceClassName "` + driver.DeviceClassWhole + `"`},
	} {
		n, s := entry(tc.mut)
		err := cfg.CheckTemplateEntry(n, s)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("want an error mentioning %q, got %v", tc.want, err)
		}
	}
}

// opaque is a config entry of this driver for the translation's request.
func opaque(params string) resourceapi.DeviceClaimConfiguration {
	return resourceapi.DeviceClaimConfiguration{
		Requests: []string{RequestName},
		DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
			Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(params)},
		}},
	}
}

func TestSpecClasses(t *testing.T) {
	s := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{
		{Name: "a", FirstAvailable: []resourceapi.DeviceSubRequest{{DeviceClassName: "s"}, {DeviceClassName: "s"}}},
		{Name: "b", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: "w"}},
	}}}
	if got := strings.Join(SpecClasses(s), ","); got != "s,w" {
		t.Errorf("classes %s, want s,w", got)
	}
}

func TestResourceNames(t *testing.T) {
	tr := Translator{Config: DefaultConfig()}
	var got []string
	for _, n := range tr.ResourceNames() {
		got = append(got, string(n))
	}
	want := []corev1.ResourceName{"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "nvidia.com/priority"}
	if len(got) != len(want) {
		t.Fatalf("names %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != string(want[i]) {
			t.Errorf("names %v, want %v", got, want)
		}
	}
}
