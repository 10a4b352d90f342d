package compat

import (
	"strings"
	"testing"
)

func TestDecodeConfig(t *testing.T) {
	c, err := Decode([]byte(`
nvidia: {enabled: true, annotations: false, gpu: example.com/gpu}
tencent: {enabled: true, memoryUnit: 512Mi}
`))
	if err != nil {
		t.Fatal(err)
	}
	if c.NVIDIA.GPU != "example.com/gpu" || c.NVIDIA.Memory != "nvidia.com/gpumem" || c.NVIDIA.Priority != "nvidia.com/priority" || c.NVIDIA.Annotations || c.Aliyun.Enabled {
		t.Errorf("decoded %+v", c)
	}
	if c.Tencent.MemoryUnit.String() != "512Mi" || c.WholeClass != "gpu.gpulink.dev" {
		t.Errorf("tencent %+v class %s", c.Tencent, c.WholeClass)
	}
	tr := Translator{Config: c}
	r, err := tr.Translate(podWith(ctr("a", map[string]string{"example.com/gpu": "1"})))
	if err != nil || len(r.Claims) != 1 {
		t.Fatalf("renamed gpu: %+v %v", r, err)
	}
	if r, err := tr.Translate(podWith(ctr("a", map[string]string{"nvidia.com/gpu": "1"}))); r != nil || err != nil {
		t.Fatalf("old name still translated: %+v %v", r, err)
	}
}

func TestDecodeConfigRefused(t *testing.T) {
	cases := map[string][]string{
		"unknown field":   {`nvidia: {enabled: true, gpuz: x}`, "gpuz"},
		"duplicate field": {"aliyun: {enabled: true}\naliyun: {enabled: false}", "aliyun"},
		"not a name":      {`aliyun: {enabled: true, gpu: "gpu"}`, "aliyun.gpu", `"gpu"`},
		"reserved domain": {`aliyun: {enabled: true, gpu: kubernetes.io/gpu}`, "kubernetes.io/gpu"},
		"same name twice": {"nvidia: {enabled: true}\naliyun: {enabled: true, gpu: nvidia.com/gpu}", "aliyun.gpu", "nvidia.gpu"},
		"bad priority":    {`nvidia: {enabled: true, priority: "priority"}`, "nvidia.priority", `"priority"`},
		"priority is gpu": {`nvidia: {enabled: true, priority: nvidia.com/gpu}`, "nvidia.priority", "nvidia.gpu"},
		"zero unit":       {`tencent: {enabled: true, memoryUnit: "0"}`, "tencent.memoryUnit"},
		"bad class":       {`shareClass: "Not_A_Class"`, "shareClass", "Not_A_Class"},
		"wrong type":      {`nvidia: {enabled: "yes"}`, "enabled"},
	}
	for name, c := range cases {
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
	// Disabled families are not validated: their names are not used.
	if _, err := Decode([]byte(`aliyun: {enabled: false, gpu: nvidia.com/gpu}`)); err != nil {
		t.Errorf("disabled family: %v", err)
	}
}
