package localcluster

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// registrySocketLen is the length of the rolling-update registration
// socket's name that a kubelet plugin pod with its UID in full registers
// under: "gpu.gpulink.dev-" + a 36-byte UID + "-reg.sock", after a slash.
const registrySocketLen = 1 + len("gpu.gpulink.dev-") + 36 + len("-reg.sock")

// kubeletRegistries are where the real node's kubelet plugin registry
// lies under a test's state directory: the cluster's own directory, or a
// "c" directory beside the test's other files.
var kubeletRegistries = []string{"kubelet/plugins_registry", "c/kubelet/plugins_registry"}

// MkdirTemp makes a test's state directory under os.TempDir(), named
// prefix and random hex digits, of a length at which the chart's kubelet
// plugin pod can register: k8s.io/dynamic-resource-allocation v0.37.2
// keeps the pod's UID in full in the registration socket's name up to a
// path of 108 bytes, one more than the kernel binds (the plugin then
// refuses to start, kubeletplugin.checkRegistrarSocket). os.MkdirTemp's
// random suffix has 1 to 10 digits, so its names reached that length in
// one test run of a few dozen; here the length is chosen, then the
// digits drawn.
func MkdirTemp(prefix string) (string, error) {
	base := os.TempDir()
	for digits := 8; digits <= 12; digits += 2 {
		if registryAtLimit(filepath.Join(base, prefix+strings.Repeat("0", digits))) {
			continue
		}
		for range 100 {
			dir := filepath.Join(base, prefix+randomHex(digits))
			err := os.Mkdir(dir, 0o700)
			if err == nil {
				return dir, nil
			}
			if !errors.Is(err, fs.ErrExist) {
				return "", fmt.Errorf("making a state directory: %w", err)
			}
		}
	}
	return "", fmt.Errorf("no state directory %s/%s... whose kubelet plugin registry leaves room for a registration socket", base, prefix)
}

func registryAtLimit(dir string) bool {
	for _, r := range kubeletRegistries {
		if len(filepath.Join(dir, r))+registrySocketLen == 108 {
			return true
		}
	}
	return false
}
