package localcluster

import (
	"fmt"
	"os"
	"path/filepath"
)

// registrySocketLen is the length of the rolling-update registration
// socket's name that a kubelet plugin pod with its UID in full registers
// under: "gpu.gpulink.dev-" + a 36-byte UID + "-reg.sock", after a slash.
const registrySocketLen = 1 + len("gpu.gpulink.dev-") + 36 + len("-reg.sock")

// kubeletRegistries are where the real node's kubelet plugin registry
// lies under a test's state directory: the cluster's own directory, or a
// "c" directory beside the test's other files.
var kubeletRegistries = []string{"kubelet/plugins_registry", "c/kubelet/plugins_registry"}

// MkdirTemp is os.MkdirTemp for a test's state directory, avoiding the
// lengths at which the chart's kubelet plugin pod could not register:
// k8s.io/dynamic-resource-allocation v0.37 keeps the pod's UID in full in
// the registration socket's name up to a path of 108 bytes, one more
// than the kernel binds (the plugin then refuses to start,
// kubeletplugin.checkRegistrarSocket). os.MkdirTemp's random suffix has
// 1 to 10 digits, so one test run in a few dozen hit that length.
func MkdirTemp(prefix string) (string, error) {
	for range 20 {
		dir, err := os.MkdirTemp("", prefix)
		if err != nil {
			return "", err
		}
		if !registryAtLimit(dir) {
			return dir, nil
		}
		if err := os.Remove(dir); err != nil {
			return "", fmt.Errorf("removing %s: %w", dir, err)
		}
	}
	return "", fmt.Errorf("no temporary directory with prefix %q whose kubelet plugin registry leaves room for a registration socket", prefix)
}

func registryAtLimit(dir string) bool {
	for _, r := range kubeletRegistries {
		if len(filepath.Join(dir, r))+registrySocketLen == 108 {
			return true
		}
	}
	return false
}
