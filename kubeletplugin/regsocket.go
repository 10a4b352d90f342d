package kubeletplugin

import (
	"fmt"
	"path"

	"k8s.io/apimachinery/pkg/types"
	draplugin "k8s.io/dynamic-resource-allocation/kubeletplugin"

	"github.com/gpulink/gpulink/driver"
)

// maxUnixSocketPath is the longest path a Unix socket can be bound at:
// sun_path holds 108 bytes including the terminating NUL.
const maxUnixSocketPath = 107

// checkRegistrarSocket refuses a registration socket path one byte too
// long. With rolling updates the helper picks the socket's name by the
// length of its path (draplugin.RollingUpdateRegistrarSocketFile: the
// pod's UID in full, else a hash), but k8s.io/dynamic-resource-allocation
// v0.37.2 accepts a path of 108 bytes, which the kernel refuses ("bind:
// invalid argument"; fixed upstream by kubernetes/kubernetes#141815). A registry directory of exactly that length (with
// /var/lib/kubelet never; a kubelet root of 31 bytes, such as a test
// cluster's under /tmp, can) would then fail with that bare error; this
// says which value to change.
func checkRegistrarSocket(registrarDir string, podUID types.UID) error {
	if registrarDir == "" || podUID == "" {
		return nil
	}
	socket := path.Join(registrarDir, draplugin.RollingUpdateRegistrarSocketFile(registrarDir, driver.Name, podUID))
	if len(socket) > maxUnixSocketPath {
		return fmt.Errorf("kubelet registrar dir %q: the registration socket %s would be %d bytes, longer than a Unix socket path may be (%d); "+
			"use a kubelet root directory at least one byte shorter or longer (--kubelet-registrar-dir, chart value kubeletPlugin.kubeletRootDir)",
			registrarDir, socket, len(socket), maxUnixSocketPath)
	}
	return nil
}
