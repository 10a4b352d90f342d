package admission

import (
	resourceapi "k8s.io/api/resource/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
)

// Classes reads the share class's sharing strategy from the DeviceClass
// informer (compat.Classes).
type Classes struct {
	Lister resourcelisters.DeviceClassLister
}

// MultiGPUShares is true when the class's effective strategy is HAMiCore.
func (c *Classes) MultiGPUShares(name string) bool {
	dc, err := c.Lister.Get(name)
	if err != nil {
		return false
	}
	return classStrategy(dc) == apiv1alpha1.SharingHAMiCore
}

func classStrategy(dc *resourceapi.DeviceClass) apiv1alpha1.SharingStrategy {
	var layers [][]byte
	for _, cfg := range dc.Spec.Config {
		if cfg.Opaque != nil && cfg.Opaque.Driver == driver.Name {
			layers = append(layers, cfg.Opaque.Parameters.Raw)
		}
	}
	resolved, err := apiv1alpha1.Resolve(layers, nil)
	if err != nil || resolved.Sharing == nil {
		return ""
	}
	return resolved.Sharing.Strategy
}
