package compat

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
)

type sizes []int64

func (s sizes) MemorySizes() []int64 { return s }

const gi = int64(1) << 30

func allFamilies() Config {
	c := DefaultConfig()
	c.Aliyun.Enabled = true
	c.Tencent.Enabled = true
	return c
}

func ctr(name string, limits map[string]string) corev1.Container {
	c := corev1.Container{Name: name, Image: "busybox"}
	if limits != nil {
		c.Resources.Limits = corev1.ResourceList{}
		for k, v := range limits {
			c.Resources.Limits[corev1.ResourceName(k)] = resource.MustParse(v)
		}
	}
	return c
}

func podWith(cs ...corev1.Container) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "ns"}, Spec: corev1.PodSpec{Containers: cs}}
}

// request returns the only request of the template a container's claim uses.
func request(t *testing.T, r *Result, container string) resourceapi.DeviceRequest {
	t.Helper()
	for _, c := range r.Claims {
		if c.Container == container {
			spec, ok := r.Templates[c.Template]
			if !ok {
				t.Fatalf("template %s of container %s not in result", c.Template, container)
			}
			if n := len(spec.Spec.Devices.Requests); n != 1 {
				t.Fatalf("template %s has %d requests, want 1", c.Template, n)
			}
			if spec.Labels[LabelManaged] != "true" {
				t.Errorf("template %s lacks label %s", c.Template, LabelManaged)
			}
			return spec.Spec.Devices.Requests[0]
		}
	}
	t.Fatalf("container %s not translated: %+v", container, r.Claims)
	return resourceapi.DeviceRequest{}
}

func capReq(e *resourceapi.ExactDeviceRequest, name string) string {
	if e.Capacity == nil {
		return ""
	}
	q, ok := e.Capacity.Requests[resourceapi.QualifiedName(name)]
	if !ok {
		return ""
	}
	return q.String()
}

// TestTranslateTable covers every row of issue 8's table.
func TestTranslateTable(t *testing.T) {
	cases := []struct {
		name     string
		limits   map[string]string
		class    string
		count    int64
		mem      string
		cores    string
		firstAvl []string // memory per alternative for gpumem-percentage
	}{
		{name: "device plugin whole GPUs", limits: map[string]string{"nvidia.com/gpu": "2"}, class: driver.DeviceClassWhole, count: 2},
		{name: "HAMi memory and cores", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}, class: driver.DeviceClassShare, count: 1, mem: "3000Mi", cores: "30"},
		{name: "HAMi memory only", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, class: driver.DeviceClassShare, count: 1, mem: "3000Mi"},
		{name: "HAMi cores only", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}, class: driver.DeviceClassShare, count: 1, cores: "30"},
		{name: "HAMi memory without gpu count defaults to one GPU", limits: map[string]string{"nvidia.com/gpumem": "1024"}, class: driver.DeviceClassShare, count: 1, mem: "1Gi"},
		{name: "HAMi memory percentage", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, firstAvl: []string{"20Gi", "40Gi"}, count: 1},
		{name: "HAMi two GPUs with memory on each", limits: map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"}, class: driver.DeviceClassShare, count: 2, mem: "8000Mi"},
		{name: "gputopology extender", limits: map[string]string{"aliyun.com/gpu": "4"}, class: driver.DeviceClassWhole, count: 4},
		{name: "gpu-manager whole GPUs", limits: map[string]string{"tencent.com/vcuda-core": "200"}, class: driver.DeviceClassWhole, count: 2},
		{name: "gpu-manager whole GPU memory ignored", limits: map[string]string{"tencent.com/vcuda-core": "100", "tencent.com/vcuda-memory": "60"}, class: driver.DeviceClassWhole, count: 1},
		{name: "gpu-manager share", limits: map[string]string{"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "20"}, class: driver.DeviceClassShare, count: 1, mem: "5Gi", cores: "30"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := Translator{Config: allFamilies(), Inventory: sizes{40 * gi, 80 * gi}}
			in := podWith(ctr("main", tc.limits))
			in.Spec.Containers[0].Resources.Limits["cpu"] = resource.MustParse("1")
			r, err := tr.Translate(in)
			if err != nil {
				t.Fatal(err)
			}
			if r == nil || len(r.Claims) != 1 {
				t.Fatalf("want one translated container, got %+v", r)
			}
			req := request(t, r, "main")
			if tc.firstAvl != nil {
				if req.Exactly != nil || len(req.FirstAvailable) != len(tc.firstAvl) {
					t.Fatalf("want %d firstAvailable alternatives, got %+v", len(tc.firstAvl), req)
				}
				for i, sub := range req.FirstAvailable {
					e := &resourceapi.ExactDeviceRequest{Capacity: sub.Capacity}
					if got := capReq(e, driver.CapacityMemory); got != tc.firstAvl[i] {
						t.Errorf("alternative %d memory %s, want %s", i, got, tc.firstAvl[i])
					}
					if sub.DeviceClassName != driver.DeviceClassShare || sub.Count != tc.count {
						t.Errorf("alternative %d: class %s count %d", i, sub.DeviceClassName, sub.Count)
					}
					if len(sub.Selectors) != 1 || !strings.Contains(sub.Selectors[0].CEL.Expression, "memory") {
						t.Errorf("alternative %d lacks its memory-size selector: %+v", i, sub.Selectors)
					}
				}
			} else {
				e := req.Exactly
				if e == nil {
					t.Fatalf("want an exact request, got %+v", req)
				}
				if e.DeviceClassName != tc.class || e.Count != tc.count || e.AllocationMode != resourceapi.DeviceAllocationModeExactCount {
					t.Errorf("class %s count %d mode %s, want %s %d ExactCount", e.DeviceClassName, e.Count, e.AllocationMode, tc.class, tc.count)
				}
				if got := capReq(e, driver.CapacityMemory); got != tc.mem {
					t.Errorf("memory %q, want %q", got, tc.mem)
				}
				if got := capReq(e, driver.CapacityCores); got != tc.cores {
					t.Errorf("cores %q, want %q", got, tc.cores)
				}
			}
			out := r.Pod.Spec.Containers[0]
			for name := range tc.limits {
				if _, ok := out.Resources.Limits[corev1.ResourceName(name)]; ok {
					t.Errorf("%s still in limits", name)
				}
			}
			if _, ok := out.Resources.Limits["cpu"]; !ok {
				t.Error("cpu limit lost")
			}
			if len(out.Resources.Claims) != 1 || out.Resources.Claims[0].Name != "gpulink-main" {
				t.Errorf("container claims %+v", out.Resources.Claims)
			}
			if len(r.Pod.Spec.ResourceClaims) != 1 || *r.Pod.Spec.ResourceClaims[0].ResourceClaimTemplateName != r.Claims[0].Template {
				t.Errorf("pod claims %+v", r.Pod.Spec.ResourceClaims)
			}
			if len(r.Pod.Spec.SchedulingGates) != 1 || r.Pod.Spec.SchedulingGates[0].Name != driver.SchedulingGate {
				t.Errorf("gates %+v", r.Pod.Spec.SchedulingGates)
			}
			if r.Pod.Labels[LabelManaged] != "true" || !strings.Contains(r.Pod.Annotations[AnnotationTranslated], "claim gpulink-main") {
				t.Errorf("label/annotation: %v %v", r.Pod.Labels, r.Pod.Annotations)
			}
			if in.Spec.Containers[0].Resources.Claims != nil || in.Spec.ResourceClaims != nil {
				t.Error("input pod modified")
			}
		})
	}
}

func TestTranslateSeveralContainersAndInit(t *testing.T) {
	tr := Translator{Config: DefaultConfig(), Inventory: sizes{40 * gi}}
	p := podWith(ctr("a", map[string]string{"nvidia.com/gpu": "2"}), ctr("b", map[string]string{"nvidia.com/gpu": "2"}), ctr("c", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "20"}), ctr("plain", nil))
	p.Spec.InitContainers = []corev1.Container{ctr("setup", map[string]string{"nvidia.com/gpu": "1"})}
	r, err := tr.Translate(p)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Claims) != 4 {
		t.Fatalf("claims %+v", r.Claims)
	}
	// Same shape, same template; each container its own claim (own devices).
	if r.Claims[1].Template != r.Claims[2].Template || r.Claims[1].ClaimName == r.Claims[2].ClaimName {
		t.Errorf("containers a and b: %+v %+v", r.Claims[1], r.Claims[2])
	}
	if len(r.Templates) != 3 {
		t.Errorf("want 3 distinct templates (2 whole, 1 whole, share), got %d", len(r.Templates))
	}
	if !r.Claims[0].Init || r.Pod.Spec.InitContainers[0].Resources.Claims[0].Name != "gpulink-setup" {
		t.Errorf("init container: %+v %+v", r.Claims[0], r.Pod.Spec.InitContainers[0].Resources)
	}
	if len(r.Pod.Spec.ResourceClaims) != 4 {
		t.Errorf("pod claims %+v", r.Pod.Spec.ResourceClaims)
	}
	if r.Pod.Spec.Containers[3].Resources.Claims != nil {
		t.Error("plain container got a claim")
	}
}

func TestTranslateMixedWithResourceClaim(t *testing.T) {
	tr := Translator{Config: DefaultConfig()}
	p := podWith(ctr("a", map[string]string{"nvidia.com/gpu": "1"}))
	p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpulink-a"}}
	p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpulink-a", ResourceClaimTemplateName: ptr.To("mine")}}
	p.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "other"}, {Name: driver.SchedulingGate}}
	r, err := tr.Translate(p)
	if err != nil {
		t.Fatal(err)
	}
	if r.Claims[0].ClaimName == "gpulink-a" {
		t.Fatal("translated claim reuses the user's claim name")
	}
	if len(r.Pod.Spec.ResourceClaims) != 2 || len(r.Pod.Spec.Containers[0].Resources.Claims) != 2 {
		t.Errorf("claims %+v / %+v", r.Pod.Spec.ResourceClaims, r.Pod.Spec.Containers[0].Resources.Claims)
	}
	if len(r.Pod.Spec.SchedulingGates) != 2 {
		t.Errorf("gate added twice: %+v", r.Pod.Spec.SchedulingGates)
	}
}

func TestTranslateNothing(t *testing.T) {
	tr := Translator{Config: DefaultConfig()}
	p := podWith(ctr("a", map[string]string{"cpu": "1"}))
	p.Annotations = map[string]string{AnnotationUseGPUType: "!!"}
	if r, err := tr.Translate(p); r != nil || err != nil {
		t.Fatalf("pod without GPU resources: %+v %v", r, err)
	}
	// Off families are left to whoever serves them.
	p = podWith(ctr("a", map[string]string{"aliyun.com/gpu": "1"}))
	if r, err := tr.Translate(p); r != nil || err != nil {
		t.Fatalf("aliyun off: %+v %v", r, err)
	}
	// A zero count is dropped, not translated.
	p = podWith(ctr("a", map[string]string{"nvidia.com/gpu": "0", "cpu": "1"}))
	r, err := tr.Translate(p)
	if err != nil || r == nil || len(r.Claims) != 0 {
		t.Fatalf("gpu 0: %+v %v", r, err)
	}
	if _, ok := r.Pod.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"]; ok || len(r.Pod.Spec.SchedulingGates) != 0 {
		t.Errorf("gpu 0 left in limits or gated: %+v", r.Pod.Spec)
	}
}

func TestTranslateBadValues(t *testing.T) {
	cases := []struct {
		name   string
		limits map[string]string
		req    map[string]string
		inv    Inventory
		want   []string
	}{
		{name: "zero GPUs with memory", limits: map[string]string{"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1000"}, want: []string{"nvidia.com/gpu: 0", "nvidia.com/gpumem: 1000"}},
		{name: "memory larger than any GPU", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "90000"}, inv: sizes{40 * gi, 80 * gi}, want: []string{"nvidia.com/gpumem: 90000", "more than any GPU", "80Gi"}},
		{name: "cores above 100", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}, want: []string{"nvidia.com/gpucores: 150"}},
		{name: "cores zero", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "0"}, want: []string{"nvidia.com/gpucores: 0"}},
		{name: "negative count", limits: map[string]string{"nvidia.com/gpu": "-1"}, want: []string{"nvidia.com/gpu", "-1", "negative"}},
		{name: "negative memory", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "-5"}, want: []string{"nvidia.com/gpumem", "-5"}},
		{name: "fractional count", limits: map[string]string{"nvidia.com/gpu": "1.5"}, want: []string{"nvidia.com/gpu", "1500m", "whole number"}},
		{name: "milli count", limits: map[string]string{"aliyun.com/gpu": "500m"}, want: []string{"aliyun.com/gpu", "500m"}},
		{name: "fractional cores", limits: map[string]string{"tencent.com/vcuda-core": "30.5"}, want: []string{"tencent.com/vcuda-core", "30500m"}},
		{name: "percentage above 100", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "120"}, inv: sizes{40 * gi}, want: []string{"nvidia.com/gpumem-percentage: 120"}},
		{name: "memory and percentage", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000", "nvidia.com/gpumem-percentage": "10"}, inv: sizes{40 * gi}, want: []string{"nvidia.com/gpumem: 1000", "nvidia.com/gpumem-percentage: 10"}},
		{name: "percentage without inventory", limits: map[string]string{"nvidia.com/gpumem-percentage": "50"}, want: []string{"nvidia.com/gpumem-percentage: 50", "no gpulink GPU is published"}},
		{name: "requests differ from limits", limits: map[string]string{"nvidia.com/gpu": "2"}, req: map[string]string{"nvidia.com/gpu": "1"}, want: []string{"nvidia.com/gpu", "requests 1", "limits 2"}},
		{name: "vcuda-core not a multiple of 100", limits: map[string]string{"tencent.com/vcuda-core": "150"}, want: []string{"tencent.com/vcuda-core: 150"}},
		{name: "vcuda-memory alone", limits: map[string]string{"tencent.com/vcuda-memory": "4"}, want: []string{"tencent.com/vcuda-memory: 4"}},
		// HAMi knows two priorities; the error names the resource and value.
		{name: "priority 2", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "2"}, want: []string{"nvidia.com/priority: 2", "0 (high) or 1 (low)"}},
		{name: "negative priority", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "-1"}, want: []string{"nvidia.com/priority", "-1", "negative"}},
		{name: "fractional priority", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "0.5"}, want: []string{"nvidia.com/priority", "500m", "whole number"}},
		{name: "priority without a GPU", limits: map[string]string{"nvidia.com/priority": "1", "cpu": "1"}, want: []string{"nvidia.com/priority: 1", "without a GPU"}},
		{name: "priority beside zero GPUs", limits: map[string]string{"nvidia.com/gpu": "0", "nvidia.com/priority": "0"}, want: []string{"nvidia.com/priority: 0", "without a GPU"}},
		{name: "two families", limits: map[string]string{"nvidia.com/gpu": "1", "aliyun.com/gpu": "1"}, want: []string{"nvidia.com/gpu: 1", "aliyun.com/gpu: 1"}},
		// One firstAvailable alternative per memory size; the API allows 8.
		{name: "percentage with nine memory sizes", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"},
			inv:  sizes{8 * gi, 12 * gi, 16 * gi, 24 * gi, 32 * gi, 40 * gi, 48 * gi, 80 * gi, 141 * gi},
			want: []string{"nvidia.com/gpumem-percentage: 50", "9 memory sizes", "8Gi, 12Gi", "141Gi", "at most 8", "nvidia.com/gpumem"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tr := Translator{Config: allFamilies(), Inventory: tc.inv}
			c := ctr("main", tc.limits)
			for k, v := range tc.req {
				c.Resources.Requests = corev1.ResourceList{corev1.ResourceName(k): resource.MustParse(v)}
			}
			r, err := tr.Translate(podWith(c))
			if err == nil {
				t.Fatalf("accepted: %+v", r)
			}
			for _, w := range append(tc.want, `container "main"`) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestAnnotations(t *testing.T) {
	a100 := device("NVIDIA A100-SXM4-40GB", "GPU-11111111-2222-3333-4444-555555555555", 40*gi)
	v100 := device("Tesla V100-SXM2-32GB", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 32*gi)
	cases := []struct {
		ann        map[string]string
		a100, v100 bool
	}{
		{ann: map[string]string{AnnotationUseGPUType: "A100"}, a100: true},
		{ann: map[string]string{AnnotationUseGPUType: "a100, V100"}, a100: true, v100: true},
		{ann: map[string]string{AnnotationNoUseGPUType: "A100"}, v100: true},
		{ann: map[string]string{AnnotationUseGPUUUID: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}, v100: true},
		{ann: map[string]string{AnnotationNoUseGPUUUID: "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee"}, a100: true},
		{ann: map[string]string{AnnotationNodePolicy: "binpack", AnnotationGPUPolicy: "spread"}, a100: true, v100: true},
		// The pod's own policy, whatever the controller's flags: no selector.
		{ann: map[string]string{AnnotationNodePolicy: "Spread", AnnotationGPUPolicy: "binpack"}, a100: true, v100: true},
	}
	for _, tc := range cases {
		tr := Translator{Config: DefaultConfig()}
		p := podWith(ctr("a", map[string]string{"nvidia.com/gpu": "1"}))
		p.Annotations = tc.ann
		r, err := tr.Translate(p)
		if err != nil {
			t.Fatalf("%v: %v", tc.ann, err)
		}
		sels := request(t, r, "a").Exactly.Selectors
		for _, d := range []struct {
			dev  dracel.Device
			want bool
		}{{a100, tc.a100}, {v100, tc.v100}} {
			got := true
			for _, s := range sels {
				prog := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true}).CompileCELExpression(s.CEL.Expression, dracel.Options{})
				if prog.Error != nil {
					t.Fatalf("%v: %s: %v", tc.ann, s.CEL.Expression, prog.Error)
				}
				m, _, err := prog.DeviceMatches(context.Background(), d.dev)
				if err != nil {
					t.Fatalf("%s: %v", s.CEL.Expression, err)
				}
				got = got && m
			}
			if got != d.want {
				t.Errorf("%v on %v: match %v, want %v", tc.ann, d.dev.Attributes, got, d.want)
			}
		}
	}
}

func TestAnnotationsRefused(t *testing.T) {
	cases := map[string][2]string{
		"bad product":     {AnnotationUseGPUType, "A100;x"},
		"bad uuid":        {AnnotationUseGPUUUID, "gpu-0"},
		"empty list item": {AnnotationNoUseGPUType, "A100,,V100"},
		"bad policy":      {AnnotationNodePolicy, "random"},
		"unknown hami":    {"hami.io/vgpu-mode", "mig"},
		"unknown use":     {"nvidia.com/use-gpumode", "x"},
	}
	for name, kv := range cases {
		tr := Translator{Config: DefaultConfig()}
		p := podWith(ctr("a", map[string]string{"nvidia.com/gpu": "1"}))
		p.Annotations = map[string]string{kv[0]: kv[1]}
		_, err := tr.Translate(p)
		if err == nil || !strings.Contains(err.Error(), kv[0]) || !strings.Contains(err.Error(), kv[1]) {
			t.Errorf("%s: error %v does not name %s=%s", name, err, kv[0], kv[1])
		}
	}
}

// TestPercentageSelectorsMatchSizes evaluates the memory-size selectors
// of a gpumem-percentage translation on devices of each size.
func TestPercentageSelectorsMatchSizes(t *testing.T) {
	tr := Translator{Config: DefaultConfig(), Inventory: sizes{32 * gi, 40 * gi}}
	r, err := tr.Translate(podWith(ctr("a", map[string]string{"nvidia.com/gpumem-percentage": "25"})))
	if err != nil {
		t.Fatal(err)
	}
	req := request(t, r, "a")
	devs := []dracel.Device{device("V100", "GPU-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", 32*gi), device("A100", "GPU-11111111-2222-3333-4444-555555555555", 40*gi)}
	for i, sub := range req.FirstAvailable {
		prog := dracel.GetCompiler(dracel.Features{EnableConsumableCapacity: true}).CompileCELExpression(sub.Selectors[0].CEL.Expression, dracel.Options{})
		if prog.Error != nil {
			t.Fatal(prog.Error)
		}
		for j, d := range devs {
			m, _, err := prog.DeviceMatches(context.Background(), d)
			if err != nil {
				t.Fatal(err)
			}
			if m != (i == j) {
				t.Errorf("alternative %d on device %d: %v", i, j, m)
			}
		}
	}
}

func device(product, uuid string, mem int64) dracel.Device {
	return dracel.Device{
		Driver: driver.Name,
		Attributes: map[resourceapi.QualifiedName]resourceapi.DeviceAttribute{
			driver.AttrProductName: {StringValue: ptr.To(product)},
			driver.AttrUUID:        {StringValue: ptr.To(uuid)},
		},
		Capacity: map[resourceapi.QualifiedName]resourceapi.DeviceCapacity{
			driver.CapacityMemory: {Value: *resource.NewQuantity(mem, resource.BinarySI)},
			driver.CapacityCores:  {Value: resource.MustParse("100")},
		},
	}
}

// TestTranslateComplementaryPercentagesFitOneGPU: shares whose memory
// percentages add up to 100 fit one GPU, as HAMi places them
// (use_sharing_card.yaml: 40 %/60 % on a 48 GiB A40 was 19661 + 29492 MiB
// > 49152 MiB, rounded up per share).
func TestTranslateComplementaryPercentagesFitOneGPU(t *testing.T) {
	for _, size := range []int64{48 * gi, 40 * gi, 80 * gi, 24*gi + 7<<20} {
		tr := Translator{Config: DefaultConfig(), Inventory: sizes{size}}
		for _, split := range [][]string{{"40", "60"}, {"33", "33", "34"}, {"10", "90"}, {"1", "99"}} {
			var sum int64
			for _, pct := range split {
				r, err := tr.Translate(podWith(ctr("main", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": pct})))
				if err != nil {
					t.Fatal(err)
				}
				req := request(t, r, "main")
				if len(req.FirstAvailable) != 1 {
					t.Fatalf("alternatives %+v", req.FirstAvailable)
				}
				q := req.FirstAvailable[0].Capacity.Requests["memory"]
				if q.Value()%(1<<20) != 0 {
					t.Errorf("%s%% of %d bytes asks %s: not whole MiB, so it is rounded up when consumed", pct, size, q.String())
				}
				sum += q.Value()
			}
			if sum > size {
				t.Errorf("shares %v of a %d-byte GPU ask %d bytes together: they do not fit one GPU", split, size, sum)
			}
		}
	}
}

// TestTranslateRegularInitContainerReusesClaim: a regular init container
// runs to completion before the app containers start, so (as with the
// device plugin, which hands its devices on) it uses the claim of a
// container asking the same shape instead of holding GPUs of its own for
// the pod's life: init 2 + main 2 is 2 GPUs, not 4. A restartable sidecar
// runs alongside and keeps a claim of its own.
func TestTranslateRegularInitContainerReusesClaim(t *testing.T) {
	tr := Translator{Config: DefaultConfig(), Inventory: sizes{40 * gi}}
	p := podWith(ctr("main", map[string]string{"nvidia.com/gpu": "2"}), ctr("share", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}))
	always := corev1.ContainerRestartPolicyAlways
	sidecar := ctr("sidecar", map[string]string{"nvidia.com/gpu": "2"})
	sidecar.RestartPolicy = &always
	p.Spec.InitContainers = []corev1.Container{
		ctr("setup", map[string]string{"nvidia.com/gpu": "2"}),
		ctr("warm", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4000"}),
		ctr("one-a", map[string]string{"nvidia.com/gpu": "1"}),
		ctr("one-b", map[string]string{"nvidia.com/gpu": "1"}),
		sidecar,
	}
	r, err := tr.Translate(p)
	if err != nil {
		t.Fatal(err)
	}
	claimOf := map[string]string{}
	for _, c := range r.Claims {
		claimOf[c.Container] = c.ClaimName
	}
	if claimOf["setup"] != claimOf["main"] || claimOf["warm"] != claimOf["share"] {
		t.Errorf("regular init containers do not reuse the app containers' claims of their shape: %v", claimOf)
	}
	if claimOf["one-a"] != claimOf["one-b"] || claimOf["one-a"] == claimOf["main"] {
		t.Errorf("two regular init containers of one shape run one after the other and may share a claim: %v", claimOf)
	}
	if claimOf["sidecar"] == claimOf["main"] || claimOf["sidecar"] == claimOf["setup"] {
		t.Errorf("a restartable sidecar runs alongside the app and needs its own GPUs: %v", claimOf)
	}
	// main (2), share, one-a/b (1), sidecar (2): four pod claims.
	if n := len(r.Pod.Spec.ResourceClaims); n != 4 {
		t.Errorf("%d pod claims, want 4: %+v", n, r.Pod.Spec.ResourceClaims)
	}
	checkClaimRefs(t, r)

	// A regular init container after a sidecar runs beside it: its own
	// claim. One before a sidecar (and no app container of its shape)
	// has finished when the sidecar starts: the sidecar's claim.
	sc1 := ctr("sc1", map[string]string{"nvidia.com/gpu": "3"})
	sc1.RestartPolicy = &always
	sc2 := ctr("sc2", map[string]string{"nvidia.com/gpu": "4"})
	sc2.RestartPolicy = &always
	p = podWith(ctr("main", nil))
	p.Spec.InitContainers = []corev1.Container{sc1, ctr("late", map[string]string{"nvidia.com/gpu": "3"}), ctr("early", map[string]string{"nvidia.com/gpu": "4"}), sc2}
	if r, err = tr.Translate(p); err != nil {
		t.Fatal(err)
	}
	claimOf = map[string]string{}
	for _, c := range r.Claims {
		claimOf[c.Container] = c.ClaimName
	}
	if claimOf["late"] == claimOf["sc1"] || claimOf["early"] != claimOf["sc2"] {
		t.Errorf("claims %v: want late apart from sc1 (running beside it), early on sc2's", claimOf)
	}
	if n := len(r.Pod.Spec.ResourceClaims); n != 3 {
		t.Errorf("%d pod claims, want 3: %+v", n, r.Pod.Spec.ResourceClaims)
	}
	checkClaimRefs(t, r)
}

// checkClaimRefs fails unless every pod claim is listed once and each
// container that asks for GPUs uses exactly one of them.
func checkClaimRefs(t *testing.T, r *Result) {
	t.Helper()
	seen := map[string]bool{}
	for _, rc := range r.Pod.Spec.ResourceClaims {
		if seen[rc.Name] {
			t.Errorf("pod claim %s listed twice", rc.Name)
		}
		seen[rc.Name] = true
	}
	translated := map[string]bool{}
	for _, c := range r.Claims {
		translated[c.Container] = true
	}
	for _, c := range append(slices.Clone(r.Pod.Spec.InitContainers), r.Pod.Spec.Containers...) {
		if !translated[c.Name] {
			continue
		}
		if len(c.Resources.Claims) != 1 || !seen[c.Resources.Claims[0].Name] {
			t.Errorf("container %s uses claims %+v", c.Name, c.Resources.Claims)
		}
	}
}

// HAMi's task priority never stays on the pod: it becomes the claim's
// sharing.priority, 0 (high) as well as 1 (low), on shares and whole GPUs.
func TestTranslatePriority(t *testing.T) {
	for _, tc := range []struct {
		name   string
		limits map[string]string
		want   int
		class  string
	}{
		{name: "low priority share", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30", "nvidia.com/priority": "1"}, want: 1, class: driver.DeviceClassShare},
		{name: "high priority share", limits: map[string]string{"nvidia.com/gpucores": "30", "nvidia.com/priority": "0"}, want: 0, class: driver.DeviceClassShare},
		{name: "whole GPU", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "1"}, want: 1, class: driver.DeviceClassWhole},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr := Translator{Config: DefaultConfig()}
			c := ctr("main", tc.limits)
			c.Resources.Requests = corev1.ResourceList{"nvidia.com/priority": c.Resources.Limits["nvidia.com/priority"]}
			r, err := tr.Translate(podWith(c))
			if err != nil {
				t.Fatal(err)
			}
			out := r.Pod.Spec.Containers[0].Resources
			if _, ok := out.Limits["nvidia.com/priority"]; ok {
				t.Errorf("nvidia.com/priority left in limits: %v", out.Limits)
			}
			if _, ok := out.Requests["nvidia.com/priority"]; ok {
				t.Errorf("nvidia.com/priority left in requests: %v", out.Requests)
			}
			if req := request(t, r, "main"); req.Exactly == nil || req.Exactly.DeviceClassName != tc.class {
				t.Errorf("request %+v, want one of class %s", req, tc.class)
			}
			spec := r.Templates[r.Claims[0].Template].Spec
			if len(spec.Devices.Config) != 1 {
				t.Fatalf("template config %+v, want one entry", spec.Devices.Config)
			}
			cfg := spec.Devices.Config[0]
			if !slices.Equal(cfg.Requests, []string{RequestName}) || cfg.Opaque == nil || cfg.Opaque.Driver != driver.Name {
				t.Fatalf("config entry %+v, want an opaque %s config for request %s", cfg, driver.Name, RequestName)
			}
			got, err := v1alpha1.Normalize(cfg.Opaque.Parameters.Raw)
			if err != nil {
				t.Fatalf("the template's config does not decode: %v", err)
			}
			if p := got.Sharing.Priority; p == nil || *p != tc.want {
				t.Errorf("sharing.priority %v, want %d", p, tc.want)
			}
			if !strings.Contains(r.Pod.Annotations[AnnotationTranslated], "nvidia.com/priority: "+strconv.Itoa(tc.want)) {
				t.Errorf("summary %q does not say where the priority came from", r.Pod.Annotations[AnnotationTranslated])
			}
			specs, err := DecodeTemplates(r.Pod.Annotations[AnnotationTemplates])
			if err != nil {
				t.Fatal(err)
			}
			if err := tr.Config.CheckTemplateEntry(r.Claims[0].Template, specs[r.Claims[0].Template]); err != nil {
				t.Errorf("the translation's own priority entry is refused: %v", err)
			}
		})
	}
}

// Two containers asking for the same share at different priorities get
// claims of different templates; a regular init container does not take
// over the claim of an app container of another priority.
func TestTranslatePrioritySeparatesClaims(t *testing.T) {
	tr := Translator{Config: DefaultConfig()}
	share := func(p string) map[string]string {
		return map[string]string{"nvidia.com/gpumem": "1000", "nvidia.com/priority": p}
	}
	pod := podWith(ctr("hi", share("0")), ctr("lo", share("1")))
	pod.Spec.InitContainers = []corev1.Container{ctr("setup", map[string]string{"nvidia.com/gpumem": "1000"})}
	r, err := tr.Translate(pod)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := map[string]string{}
	claim := map[string]string{}
	for _, c := range r.Claims {
		tmpl[c.Container], claim[c.Container] = c.Template, c.ClaimName
	}
	if tmpl["hi"] == tmpl["lo"] || tmpl["setup"] == tmpl["hi"] || tmpl["setup"] == tmpl["lo"] {
		t.Errorf("templates %v: want one per priority (and one without)", tmpl)
	}
	if claim["setup"] == claim["hi"] || claim["setup"] == claim["lo"] {
		t.Errorf("claims %v: the init container without a priority took a prioritized claim", claim)
	}
}
