package planner

import (
	"fmt"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
)

// SharingLabel marks a DeviceClass whose requests are shares of one GPU
// (value "true") rather than whole GPUs. Labels survive renaming a class
// (e.g. by a Helm release), so the controller never relies on class names.
//
// A request is a share when its DeviceClass carries SharingLabel=true or
// when it asks for capacity (exactly.capacity.requests); every other
// gpulink request is for whole GPUs, given out exclusively.
const SharingLabel = "gpu.gpulink.dev/sharing"

// MIGLabel marks a DeviceClass whose requests are MIG devices (value
// "true"). Such requests are matched against the nodes' MIG devices only,
// every other request against whole GPUs only, so neither kind is ever
// handed out as the other whatever a class's selectors say.
const MIGLabel = "gpu.gpulink.dev/mig"

// Selector expressions of the shipped classes. The whole class leaves
// out MIG devices (those with a profile attribute): a GPU in MIG mode is
// only ever given out as its MIG devices, and they are no whole GPUs. The
// share class also requires allowMultipleAllocations, which every GPU
// device publishes and no MIG device does; a device that cannot be shared
// never matches it.
const (
	wholeClassSelector = `device.driver == "` + driver.Name + `" && !("` + driver.AttrMIGProfile + `" in device.attributes["` + driver.Name + `"])`
	shareClassSelector = `device.driver == "` + driver.Name + `" && device.allowMultipleAllocations`
	migClassSelector   = `device.driver == "` + driver.Name + `" && "` + driver.AttrMIGProfile + `" in device.attributes["` + driver.Name + `"]`
)

// DeviceClasses returns the DeviceClasses gpulink ships: whole GPUs
// (driver.DeviceClassWhole), shares (driver.DeviceClassShare, MPS with a
// server per claim), MIG devices (driver.DeviceClassMIG) and concurrent
// shares (driver.DeviceClassShareConcurrent, MPS with one server per
// namespace and GPU). The YAML in deployments/deviceclasses/ and the Helm
// chart carry the same content.
func DeviceClasses() []*resourceapi.DeviceClass {
	return []*resourceapi.DeviceClass{
		{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
			ObjectMeta: metav1.ObjectMeta{
				Name:   driver.DeviceClassWhole,
				Labels: map[string]string{SharingLabel: "false"},
			},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: wholeClassSelector}}},
			},
		},
		shareClass(driver.DeviceClassShare, `{"strategy":"MPS"}`),
		{
			TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
			ObjectMeta: metav1.ObjectMeta{
				Name:   driver.DeviceClassMIG,
				Labels: map[string]string{MIGLabel: "true"},
			},
			Spec: resourceapi.DeviceClassSpec{
				Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: migClassSelector}}},
			},
		},
		shareClass(driver.DeviceClassShareConcurrent, `{"mpsMode":"Concurrent","strategy":"MPS"}`),
	}
}

// shareClass is a class of shares (SharingLabel) whose configuration sets
// the sharing section given as JSON (keys sorted, as the manifest's YAML
// decodes to).
func shareClass(name, sharing string) *resourceapi.DeviceClass {
	return &resourceapi.DeviceClass{
		TypeMeta: metav1.TypeMeta{APIVersion: resourceapi.SchemeGroupVersion.String(), Kind: "DeviceClass"},
		ObjectMeta: metav1.ObjectMeta{
			Name:   name,
			Labels: map[string]string{SharingLabel: "true"},
		},
		Spec: resourceapi.DeviceClassSpec{
			Selectors: []resourceapi.DeviceSelector{{CEL: &resourceapi.CELDeviceSelector{Expression: shareClassSelector}}},
			Config: []resourceapi.DeviceClassConfiguration{{
				DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
					Driver: driver.Name,
					Parameters: runtime.RawExtension{Raw: []byte(fmt.Sprintf(
						`{"apiVersion":%q,"kind":%q,"sharing":%s}`, v1alpha1.APIVersion, v1alpha1.Kind, sharing))},
				}},
			}},
		},
	}
}

// isShareClass reports whether requests on the class are shares.
func isShareClass(class *resourceapi.DeviceClass) bool {
	return class.Labels[SharingLabel] == "true"
}

// IsMIGClass reports whether requests on the class are MIG devices.
func IsMIGClass(class *resourceapi.DeviceClass) bool {
	return class.Labels[MIGLabel] == "true"
}
