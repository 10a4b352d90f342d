package discovery

import (
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"strconv"
	"strings"
)

// hostSysfsRoot is where the kernel mounts sysfs. The kubelet plugin runs
// in a container that sees the host's /sys.
const hostSysfsRoot = "/sys"

// sysfs reads what NVML does not say about a GPU's place in the machine
// from a sysfs tree. It works on any fs.ReadLinkFS so tests and the mock
// backend can hand it an in-memory tree (fstest.MapFS) instead of /sys.
type sysfs struct {
	fsys fs.ReadLinkFS
}

// pcieRootPattern matches a root complex directory under /sys/devices,
// e.g. "pci0000:00" or, behind Intel VMD, "pci10000:e0".
var pcieRootPattern = regexp.MustCompile(`^pci[0-9a-f]{4,8}:[0-9a-f]{2}$`)

// cpuListPattern matches the kernel's cpulist format, e.g. "0-31,64-95".
var cpuListPattern = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)

func devicePath(busID string) string { return path.Join("bus/pci/devices", busID) }

// pcieRoot returns the root complex ("pci<domain>:<bus>") the device
// hangs off, or "" when sysfs does not know the device. The
// bus/pci/devices/<busID> entry is a symlink into /sys/devices, whose
// directory nesting mirrors the PCIe hierarchy, so the first path element
// below devices/ names the root complex.
func (s sysfs) pcieRoot(busID string) (string, error) {
	link := devicePath(busID)
	target, err := s.fsys.ReadLink(link)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("resolve PCIe root of %s: %w", busID, err)
	}
	resolved := target
	if !path.IsAbs(target) {
		resolved = path.Join(path.Dir(link), target)
	}
	elems := strings.Split(strings.TrimPrefix(resolved, "/"), "/")
	for i := 0; i+1 < len(elems); i++ {
		if elems[i] == "devices" && pcieRootPattern.MatchString(elems[i+1]) {
			return elems[i+1], nil
		}
	}
	return "", fmt.Errorf("resolve PCIe root of %s: symlink target %q has no pci<domain>:<bus> element below devices/", busID, target)
}

// numaNode returns the NUMA node sysfs reports for the device, or -1 when
// it does not know the device or the platform has no NUMA affinity (the
// kernel writes -1 then).
func (s sysfs) numaNode(busID string) (int, error) {
	file := path.Join(devicePath(busID), "numa_node")
	data, err := fs.ReadFile(s.fsys, file)
	if errors.Is(err, fs.ErrNotExist) {
		return -1, nil
	}
	if err != nil {
		return -1, fmt.Errorf("read NUMA node of %s: %w", busID, err)
	}
	text := strings.TrimSpace(string(data))
	n, err := strconv.Atoi(text)
	if err != nil || n < -1 {
		return -1, fmt.Errorf("read NUMA node of %s: %s holds %q, want an integer >= -1", busID, file, text)
	}
	return n, nil
}

// cpuAffinity returns the CPUs local to the device in the kernel's cpulist
// format (e.g. "0-31,64-95"), or "" when sysfs does not know the device.
func (s sysfs) cpuAffinity(busID string) (string, error) {
	file := path.Join(devicePath(busID), "local_cpulist")
	data, err := fs.ReadFile(s.fsys, file)
	if errors.Is(err, fs.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read CPU affinity of %s: %w", busID, err)
	}
	text := strings.TrimSpace(string(data))
	if !cpuListPattern.MatchString(text) {
		return "", fmt.Errorf("read CPU affinity of %s: %s holds %q, want a cpulist such as 0-31,64-95", busID, file, text)
	}
	return text, nil
}
