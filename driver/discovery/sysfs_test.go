package discovery

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
)

func TestSysfs(t *testing.T) {
	fsys := fstest.MapFS{
		"bus/pci/devices/0000:07:00.0":                                            {Data: []byte("../../../devices/pci0000:00/0000:00:01.1/0000:02:00.0/0000:07:00.0"), Mode: fs.ModeSymlink},
		"devices/pci0000:00/0000:00:01.1/0000:02:00.0/0000:07:00.0/numa_node":     {Data: []byte("3\n")},
		"devices/pci0000:00/0000:00:01.1/0000:02:00.0/0000:07:00.0/local_cpulist": {Data: []byte("48-63,176-191\n")},
		// An absolute target, as some container runtimes present it.
		"bus/pci/devices/0000:87:00.0": {Data: []byte("/sys/devices/pci0000:80/0000:80:01.1/0000:87:00.0"), Mode: fs.ModeSymlink},
		// No NUMA affinity: the kernel writes -1.
		"bus/pci/devices/0000:09:00.0":                  {Data: []byte("../../../devices/pci0000:00/0000:09:00.0"), Mode: fs.ModeSymlink},
		"devices/pci0000:00/0000:09:00.0/numa_node":     {Data: []byte("-1\n")},
		"devices/pci0000:00/0000:09:00.0/local_cpulist": {Data: []byte("0-7\n")},
		"bus/pci/devices/0000:0a:00.0":                  {Data: []byte("../../../devices/platform/0000:0a:00.0"), Mode: fs.ModeSymlink},
		"bus/pci/devices/0000:0b:00.0":                  {Data: []byte("../../../devices/pci0000:00/0000:0b:00.0"), Mode: fs.ModeSymlink},
		"devices/pci0000:00/0000:0b:00.0/numa_node":     {Data: []byte("zero\n")},
		"devices/pci0000:00/0000:0b:00.0/local_cpulist": {Data: []byte("0-7;9\n")},
		"bus/pci/devices/0000:0c:00.0":                  {Data: []byte("../../../devices/pci0000:00/0000:0c:00.0"), Mode: fs.ModeSymlink},
		"devices/pci0000:00/0000:0c:00.0/numa_node":     {Data: []byte("-2")},
		"devices/pci0000:00/0000:0c:00.0/local_cpulist": {Data: []byte("")},
	}
	s := sysfs{fsys: fsys}
	tests := []struct {
		busID                 string
		root                  string
		numa                  int
		cpus                  string
		rootErr, numaErr, cpu string
	}{
		{busID: "0000:07:00.0", root: "pci0000:00", numa: 3, cpus: "48-63,176-191"},
		{busID: "0000:87:00.0", root: "pci0000:80", numa: -1},
		{busID: "0000:09:00.0", root: "pci0000:00", numa: -1, cpus: "0-7"},
		{busID: "0000:ff:00.0", root: "", numa: -1},
		{busID: "0000:0a:00.0", rootErr: "no pci<domain>:<bus> element", numa: -1},
		{busID: "0000:0b:00.0", root: "pci0000:00", numaErr: `holds "zero"`, cpu: `holds "0-7;9"`},
		{busID: "0000:0c:00.0", root: "pci0000:00", numaErr: `holds "-2"`, cpu: `holds ""`},
	}
	for _, tc := range tests {
		t.Run(tc.busID, func(t *testing.T) {
			root, err := s.pcieRoot(tc.busID)
			checkResult(t, "pcieRoot", root, tc.root, err, tc.rootErr)
			numa, err := s.numaNode(tc.busID)
			checkResult(t, "numaNode", numa, tc.numa, err, tc.numaErr)
			cpus, err := s.cpuAffinity(tc.busID)
			checkResult(t, "cpuAffinity", cpus, tc.cpus, err, tc.cpu)
		})
	}
}

func checkResult[T comparable](t *testing.T, call string, got, want T, err error, wantErr string) {
	t.Helper()
	if wantErr != "" {
		if err == nil || !strings.Contains(err.Error(), wantErr) {
			t.Errorf("%s: got %v, %v; want error containing %q", call, got, err, wantErr)
		}
		return
	}
	if err != nil || got != want {
		t.Errorf("%s: got %v, %v; want %v", call, got, err, want)
	}
}

// TestSysfsOnDisk runs the reader on a real directory tree with real
// symlinks, the way NewNVML reads /sys.
func TestSysfsOnDisk(t *testing.T) {
	dir := t.TempDir()
	dev := filepath.Join(dir, "devices", "pci0000:40", "0000:40:01.1", "0000:47:00.0")
	if err := os.MkdirAll(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "numa_node"), []byte("1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dev, "local_cpulist"), []byte("16-31,144-159\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	links := filepath.Join(dir, "bus", "pci", "devices")
	if err := os.MkdirAll(links, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("../../../devices/pci0000:40/0000:40:01.1/0000:47:00.0", filepath.Join(links, "0000:47:00.0")); err != nil {
		t.Fatal(err)
	}
	s := sysfs{fsys: os.DirFS(dir).(fs.ReadLinkFS)}
	root, err := s.pcieRoot("0000:47:00.0")
	checkResult(t, "pcieRoot", root, "pci0000:40", err, "")
	numa, err := s.numaNode("0000:47:00.0")
	checkResult(t, "numaNode", numa, 1, err, "")
	cpus, err := s.cpuAffinity("0000:47:00.0")
	checkResult(t, "cpuAffinity", cpus, "16-31,144-159", err, "")
}
