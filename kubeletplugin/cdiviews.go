package kubeletplugin

import (
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	cdiparser "tags.cncf.io/container-device-interface/pkg/parser"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
)

// Request views.
//
// A claim whose MPS shares sit beside GPUs outside MPS (NVIDIA's quickstart
// gpu-test5: a whole GPU and an MPS share, each request used by its own
// containers) cannot give all its containers one environment: a CUDA
// process with CUDA_MPS_PIPE_DIRECTORY set sees only the MPS server's
// GPUs, so the whole GPU's containers must not get the MPS variables, and
// the MPS containers must number their GPUs as the claim's daemon does.
// Such a claim gets one more CDI device per request (a "view"), applied
// after the claim device, holding what the request's containers see:
// NVIDIA_VISIBLE_DEVICES, GPULINK_DEVICE_<i> and the share variables
// numbered within the request, and the MPS variables only for the MPS
// request. A container that names the request gets exactly that; one that
// names the whole claim gets the view of the claim's last result (the
// kubelet applies CDI devices in order and the last value of a variable
// wins), which is as good as it gets for a process that cannot use an MPS
// share and a GPU outside MPS at once anyway. Claims without that mix keep
// the single claim device.

// needsRequestViews says whether the claim mixes MPS shares with GPUs
// outside MPS. It depends on the devices only, so a restarted plugin
// answers the kubelet with the same CDI IDs from the checkpoint.
func (pc *PreparedClaim) needsRequestViews() bool {
	hasMPS, other := false, false
	for _, d := range pc.Devices {
		if d.Share != nil && d.Share.Strategy == apiv1alpha1.SharingMPS {
			hasMPS = true
		} else {
			other = true
		}
	}
	return hasMPS && other
}

// viewRequest is the request a result's containers name: the parent of a
// firstAvailable subrequest ("gpu/a100" → "gpu").
func viewRequest(result string) string {
	name, _, _ := strings.Cut(result, "/")
	return name
}

// viewRequests lists the claim's requests in the order of their first
// result.
func (pc *PreparedClaim) viewRequests() []string {
	var out []string
	for _, d := range pc.Devices {
		if r := viewRequest(d.Request); !slices.Contains(out, r) {
			out = append(out, r)
		}
	}
	return out
}

// requestDevices are the claim's results of one request.
func (pc *PreparedClaim) requestDevices(request string) []PreparedDevice {
	var out []PreparedDevice
	for _, d := range pc.Devices {
		if viewRequest(d.Request) == request {
			out = append(out, d)
		}
	}
	return out
}

// cdiViewDeviceName is the name of a request's view in the claim's spec.
func cdiViewDeviceName(claimUID types.UID, request string) string {
	return string(claimUID) + "-request-" + request
}

// CDIDeviceIDForRequest returns the qualified CDI device name of a
// request's view.
func CDIDeviceIDForRequest(claimUID types.UID, request string) string {
	return cdiparser.QualifiedName(CDIVendor, CDIClass, cdiViewDeviceName(claimUID, request))
}

// containerNumbering returns the GPUs the claim's containers number (its
// own, and those of the claims its containers use with it,
// containergroup.go) and each GPU's ordinal there by device name: with
// views, within the first request that has the GPU.
func containerNumbering(c *PreparedClaim, gpus []claimGPU, views bool) ([]claimGPU, map[string]int) {
	seen := gpus
	if len(c.ContainerPeers) > 0 && !views {
		seen = foldGPUs(append(slices.Clone(c.Devices), c.ContainerPeers...))
	}
	ordinals := map[string]int{}
	if views {
		for _, r := range c.viewRequests() {
			for i, g := range foldGPUs(c.requestDevices(r)) {
				if _, ok := ordinals[g.device]; !ok {
					ordinals[g.device] = i
				}
			}
		}
		return seen, ordinals
	}
	for i, g := range seen {
		ordinals[g.device] = i
	}
	return seen, ordinals
}
