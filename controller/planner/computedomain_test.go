package planner

import (
	"testing"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// NVIDIA's ComputeDomain classes are recognised by their selectors, not
// their names; gpulink's own classes, another driver's and a class
// without selectors are not ComputeDomain classes.
func TestComputeDomainClass(t *testing.T) {
	class := func(exprs ...string) *resourceapi.DeviceClass {
		c := &resourceapi.DeviceClass{ObjectMeta: metav1.ObjectMeta{Name: "c"}}
		for _, x := range exprs {
			c.Spec.Selectors = append(c.Spec.Selectors, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: x}})
		}
		return c
	}
	e := NewSelectorEvaluator()
	for _, tc := range []struct {
		name  string
		class *resourceapi.DeviceClass
		want  string
	}{
		{"default channel", class("device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'channel' && device.attributes['compute-domain.nvidia.com'].id == 0"), "channel"},
		{"any channel, two selectors", class("device.driver == 'compute-domain.nvidia.com'", `device.attributes["compute-domain.nvidia.com"].type == "channel"`), "channel"},
		{"daemon", class("device.driver == 'compute-domain.nvidia.com' && device.attributes['compute-domain.nvidia.com'].type == 'daemon'"), "daemon"},
		{"gpulink whole GPUs", DeviceClasses()[0], ""},
		{"NICs", controllertest.NICDeviceClass(), ""},
		{"no selectors", class(), ""},
		{"does not compile", class("device.driver ==="), ""},
	} {
		if got := e.ComputeDomainClass(tc.class); got != tc.want {
			t.Errorf("%s: %q, want %q", tc.name, got, tc.want)
		}
	}
}
