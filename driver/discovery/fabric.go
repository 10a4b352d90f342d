package discovery

import (
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// readClique returns the GPU's multi-node NVLink clique as
// "<cluster UUID>.<clique ID>" (the form GPU Feature Discovery gives the
// nvidia.com/gpu.clique node label, so that a domain named by the label
// and one named by the attribute are the same domain), or "" when the GPU
// has none: NVML cannot tell (ERROR_NOT_SUPPORTED on GPUs without an
// NVLink fabric, as every PCIe and HGX H100 GPU; FUNCTION_NOT_FOUND on
// drivers before R535), the fabric manager has not finished registering
// the GPU (state NOT_STARTED or IN_PROGRESS: rediscovery picks it up
// later), or registration failed (status not SUCCESS). Only a GPU whose
// registration completed is in a clique another GPU can reach over
// NVLink.
//
// It calls the v1 nvmlDeviceGetGpuFabricInfo: go-nvml's versioned
// GetGpuFabricInfoV returns a handler over the C call that no mock can
// stand in for, and v1 carries every field used here.
func readClique(index int, h nvml.Device) (string, error) {
	info, ret := h.GetGpuFabricInfo()
	switch {
	case unavailable(ret):
		return "", nil
	case ret != nvml.SUCCESS:
		return "", callError(index, "GetGpuFabricInfo", ret)
	case info.State != nvml.GPU_FABRIC_STATE_COMPLETED, nvml.Return(info.Status) != nvml.SUCCESS:
		return "", nil
	}
	return CliqueID(info.ClusterUuid, info.CliqueId), nil
}

// CliqueID formats a fabric's cluster UUID and clique ID as gpulink
// publishes them (driver.AttrCliqueID) and GPU Feature Discovery labels
// nodes (nvidia.com/gpu.clique): the UUID in its canonical lower-case
// 8-4-4-4-12 form, a dot, the clique ID in decimal.
func CliqueID(clusterUUID [16]uint8, cliqueID uint32) string {
	u := clusterUUID
	return fmt.Sprintf("%x-%x-%x-%x-%x.%d", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16], cliqueID)
}
