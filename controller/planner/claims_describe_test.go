package planner

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/driver/topology"
)

// The events name what a pod waits for in these words; users grep them.
func TestDescribeAlternative(t *testing.T) {
	class := &resourceapi.DeviceClass{Spec: resourceapi.DeviceClassSpec{Selectors: []resourceapi.DeviceSelector{{}}}}
	share := map[resourceapi.FullyQualifiedName]resource.Quantity{
		capMemory: resource.MustParse("8Gi"),
		capCores:  resource.MustParse("30"),
	}
	for _, tc := range []struct {
		name string
		alt  Alternative
		want string
	}{
		{"one GPU", Alternative{Count: 1}, "1 free GPU"},
		{"four GPUs, NVLink required", Alternative{Count: 4, RequiredLink: topology.LinkNVLink}, "4 free GPUs with every pair NVLink (policy Required)"},
		{"two GPUs, PIX required", Alternative{Count: 2, RequiredLink: topology.LinkPIX}, "2 free GPUs with every pair PIX or better (policy Required)"},
		{"all", Alternative{All: true}, "all matching GPUs of a node"},
		{"own selectors", Alternative{Count: 2, Selectors: []string{"class", "own"}}, "2 free GPUs matching the request's selectors"},
		{"a share", Alternative{Share: true, Count: 1, Capacity: share}, "a share of 8Gi memory, 30% cores"},
		{"two shares", Alternative{Share: true, Count: 2, Capacity: share}, "2 shares on distinct GPUs of 8Gi memory, 30% cores"},
		{"a share ignores the link policy", Alternative{Share: true, Count: 1, RequiredLink: topology.LinkNVLink}, "a share"},
		{"one MIG device", Alternative{MIG: true, Count: 1}, "1 free MIG device"},
		{"three MIG devices", Alternative{MIG: true, Count: 3}, "3 free MIG devices"},
		{"all MIG devices", Alternative{MIG: true, All: true}, "all matching MIG devices of a node"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.alt.Class = class
			if len(tc.alt.Selectors) == 0 {
				tc.alt.Selectors = []string{"class"}
			}
			if got := tc.alt.describe(); got != tc.want {
				t.Errorf("describe() = %q, want %q", got, tc.want)
			}
		})
	}
}
