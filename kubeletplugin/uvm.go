package kubeletplugin

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// uvmMinors are the minor numbers the nvidia-uvm module gives its nodes.
// The module registers the major but, unlike nvidia.ko with udev rules on
// most installs, creates no /dev entries: nvidia-modprobe or the first
// CUDA process run as root does. A freshly booted node whose module was
// loaded by something else can therefore lack them.
var uvmMinors = map[string]uint32{
	"/dev/nvidia-uvm":       0,
	"/dev/nvidia-uvm-tools": 1,
}

// UVMNodeCreator creates missing /dev/nvidia-uvm* nodes, as
// nvidia-modprobe does, from the major number the kernel lists for
// nvidia-uvm in /proc/devices.
type UVMNodeCreator struct {
	// ProcDevices is /proc/devices (tests: a fake).
	ProcDevices string
	// Mknod creates a node; unix.Mknod unless a test replaces it.
	Mknod func(path string, mode uint32, dev int) error
}

// NewUVMNodeCreator reads the host's /proc/devices and creates real nodes.
func NewUVMNodeCreator() *UVMNodeCreator {
	return &UVMNodeCreator{ProcDevices: "/proc/devices", Mknod: unix.Mknod}
}

// Ensure creates the UVM node path (a /dev path) at seen, where this
// process sees it. Other paths are not its business: it returns an error.
func (c *UVMNodeCreator) Ensure(path, seen string) error {
	minor, ok := uvmMinors[path]
	if !ok {
		return fmt.Errorf("%s is not an nvidia-uvm device node", path)
	}
	major, err := charMajor(c.ProcDevices, "nvidia-uvm")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(seen), 0o755); err != nil {
		return fmt.Errorf("creating %s: %w", seen, err)
	}
	// 0666 as nvidia-modprobe makes them: access is governed by the
	// container's device cgroup, which CDI opens for claimed containers.
	err = c.Mknod(seen, unix.S_IFCHR|0o666, int(unix.Mkdev(major, minor)))
	if err != nil && !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("creating %s (char %d:%d): %w", seen, major, minor, err)
	}
	// The umask may have narrowed the mode.
	if err := os.Chmod(seen, 0o666); err != nil {
		return fmt.Errorf("chmod %s: %w", seen, err)
	}
	return nil
}

// charMajor returns the major number of a character device driver from a
// /proc/devices file.
func charMajor(procDevices, name string) (uint32, error) {
	f, err := os.Open(procDevices)
	if err != nil {
		return 0, fmt.Errorf("reading %s: %w", procDevices, err)
	}
	defer func() { _ = f.Close() }()
	inChar := false
	s := bufio.NewScanner(f)
	for s.Scan() {
		line := strings.TrimSpace(s.Text())
		switch line {
		case "Character devices:":
			inChar = true
			continue
		case "Block devices:":
			inChar = false
			continue
		}
		fields := strings.Fields(line)
		if !inChar || len(fields) != 2 || fields[1] != name {
			continue
		}
		major, err := strconv.ParseUint(fields[0], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%s: bad major number %q for %s", procDevices, fields[0], name)
		}
		return uint32(major), nil
	}
	if err := s.Err(); err != nil {
		return 0, fmt.Errorf("reading %s: %w", procDevices, err)
	}
	return 0, fmt.Errorf("%s lists no character device %s: the nvidia-uvm kernel module is not loaded (load it with `nvidia-modprobe -u -c=0` or `modprobe nvidia-uvm`)", procDevices, name)
}
