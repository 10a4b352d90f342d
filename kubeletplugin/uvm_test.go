package kubeletplugin

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
	resourceapi "k8s.io/api/resource/v1"
)

const procDevicesUVM = `Character devices:
  1 mem
195 nvidia
510 nvidia-uvm

Block devices:
  8 sd
`

// fakeMknod records nodes and stands in for them with a symlink to
// /dev/null, a real character device the CDI code can stat.
type fakeMknod struct{ made map[string]int }

func (f *fakeMknod) mknod(path string, _ uint32, dev int) error {
	f.made[path] = dev
	return os.Symlink("/dev/null", path)
}

func TestUVMNodesCreatedAtPrepare(t *testing.T) {
	e := newEnv(t, loadTopology(t, "pcie-4.txt"))
	dev := filepath.Join(e.driverRoot, "dev")
	for _, n := range []string{"nvidia-uvm", "nvidia-uvm-tools"} {
		if err := os.Remove(filepath.Join(dev, n)); err != nil {
			t.Fatal(err)
		}
	}
	proc := filepath.Join(e.dir, "devices")
	if err := os.WriteFile(proc, []byte(procDevicesUVM), 0o644); err != nil {
		t.Fatal(err)
	}
	fm := &fakeMknod{made: map[string]int{}}
	e.opts.RequireDeviceNodes = true
	d, err := New(e.ctx, e.opts, Dependencies{
		Discoverer: e.disc, CDI: mustCDIDir(t, e.cdiDir), MPS: mps.NewManager(e.mpsRoot, e.daemon),
		BootID: func() (string, error) { return e.bootID, nil },
		UVM:    &UVMNodeCreator{ProcDevices: proc, Mknod: fm.mknod},
	})
	if err != nil {
		t.Fatal(err)
	}
	spec := injected(t, e, d, newClaim("c", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 0)}))
	if got, want := deviceNodes(spec), []string{"/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidiactl"}; !slices.Equal(got, want) {
		t.Errorf("device nodes %v, want %v", got, want)
	}
	// major 510, minors 0 and 1 (Linux dev_t encoding of small numbers).
	if got := fm.made[filepath.Join(dev, "nvidia-uvm")]; got != 510<<8 {
		t.Errorf("nvidia-uvm dev %#x", got)
	}
	if got := fm.made[filepath.Join(dev, "nvidia-uvm-tools")]; got != 510<<8|1 {
		t.Errorf("nvidia-uvm-tools dev %#x", got)
	}

	// Module not loaded: prepare fails, naming the cause, and leaves no spec.
	for _, n := range []string{"nvidia-uvm", "nvidia-uvm-tools"} {
		_ = os.Remove(filepath.Join(dev, n))
	}
	if err := os.WriteFile(proc, []byte("Character devices:\n195 nvidia\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c := newClaim("c2", []resourceapi.DeviceRequestAllocationResult{wholeGPU("g", 1)})
	r := prepare(t, d, c)[c.UID]
	if r.Err == nil || !strings.Contains(r.Err.Error(), "nvidia-uvm kernel module is not loaded") || !strings.Contains(r.Err.Error(), "nvidia-uvm") {
		t.Fatalf("error %v", r.Err)
	}
	if e.specExists(c.UID) {
		t.Error("spec written for a failed claim")
	}
}

func mustCDIDir(t *testing.T, dir string) *CDIDir {
	t.Helper()
	c, err := NewCDIDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
