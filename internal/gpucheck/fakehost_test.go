package gpucheck

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpulink/gpulink/driver/topology"
)

// fakeHost answers the suite's programs like a GPU host would: nvidia-smi
// prints the fixture, nvcc "builds" the probe, and runc "runs" a bundle by
// reading its config.json and printing what the probe would see there.
// CUDA in a fake container sees the GPUs whose device nodes the spec
// gives it, finds the driver only through the host rootfs or a CDI mount of
// libcuda, and has MPS memory limits enforced from its environment, capped
// by serverLimitMiB when that is set (a server-side limit).
type fakeHost struct {
	fixture        hostFixture
	gpus           []topology.GPU
	serverLimitMiB int64
	nvccErr        error
	// migMemoryBytes is what CUDA reports for a MIG device (one named
	// MIG-<uuid> in NVIDIA_VISIBLE_DEVICES, with its cap nodes); smiList
	// is nvidia-smi -L's output.
	migMemoryBytes int64
	smiList        string

	// spinMS is the fixed work's repetition time on the whole GPU
	// (fakeSpin; 100 when 0).
	spinMS float64
	// noPriority: MPS client priorities change nothing on this fake GPU.
	noPriority bool
	// anyUser: a daemon pod of any user serves clients of every user.
	anyUser bool

	mu   sync.Mutex
	runs []string
	// killed ends the fake daemon pods' containers by ID (daemonPod);
	// daemonUsers are the users they ran as.
	killed      map[string]chan struct{}
	daemonUsers []uint32
}

func (f *fakeHost) run(_ context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	f.runs = append(f.runs, filepath.Base(name)+" "+strings.Join(args, " "))
	f.mu.Unlock()
	switch filepath.Base(name) {
	case "nvidia-smi":
		if slices.Equal(args, TopoArgs) {
			return []byte(f.fixture.topoText), nil
		}
		if slices.Equal(args, QueryGPUArgs) {
			return []byte(f.fixture.queryText), nil
		}
		if slices.Equal(args, []string{"-L"}) {
			return []byte(f.smiList), nil
		}
	case "nvcc":
		if f.nvccErr != nil {
			return []byte("nvcc: not found"), f.nvccErr
		}
		return nil, os.WriteFile(args[2], []byte("fake probe"), 0o755)
	case "ldd":
		return []byte("\tnot a dynamic executable\n"), errors.New("exit status 1")
	case "runc":
		if len(args) >= 6 && args[2] == "run" && args[3] == "--bundle" {
			return f.container(args[4], args[5])
		}
		if len(args) >= 4 && args[2] == "kill" {
			f.kill(args[3])
			return nil, nil
		}
		if len(args) >= 3 && args[2] == "delete" {
			return nil, nil
		}
	}
	return nil, fmt.Errorf("fake host: unexpected command %s %v", name, args)
}

func (f *fakeHost) container(bundle, id string) ([]byte, error) {
	b, err := os.ReadFile(filepath.Join(bundle, "config.json"))
	if err != nil {
		return nil, err
	}
	var spec specs.Spec
	if err := json.Unmarshal(b, &spec); err != nil {
		return nil, err
	}
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	if filepath.Base(spec.Process.Args[0]) == "nvidia-cuda-mps-control" {
		return f.daemonPod(id, &spec)
	}
	var allocMiB int64
	args := spec.Process.Args[1:]
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "--set-env":
			k, v, _ := strings.Cut(args[i+1], "=")
			env[k] = v
			i++
		case "--alloc-mib":
			allocMiB, _ = strconv.ParseInt(args[i+1], 10, 64)
			i++
		}
	}
	var out strings.Builder
	out.WriteString("runc: some noise the parser must ignore\n")
	for _, k := range []string{"NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "CUDA_MPS_CLIENT_PRIORITY"} {
		if v, ok := env[k]; ok {
			fmt.Fprintf(&out, "gpucheck: env.%s=%s\n", k, v)
		}
	}
	nodes := map[string]bool{}
	for _, d := range spec.Linux.Devices {
		nodes[d.Path] = true
		fmt.Fprintf(&out, "gpucheck: devnode=%s\n", d.Path)
	}
	if !strings.HasPrefix(filepath.Base(spec.Process.Args[0]), "gpucheck-probe") {
		return []byte(out.String()), nil // the dry run's shell probe
	}
	hostRootfs, libcuda, pipeMounted := false, false, false
	for _, m := range spec.Mounts {
		hostRootfs = hostRootfs || (m.Destination == "/usr" && (m.Type == "bind" || m.Type == "overlay"))
		libcuda = libcuda || strings.Contains(m.Destination, "libcuda.so")
		pipeMounted = pipeMounted || (env["CUDA_MPS_PIPE_DIRECTORY"] != "" && m.Destination == env["CUDA_MPS_PIPE_DIRECTORY"])
	}
	switch {
	case !hostRootfs && !libcuda:
		out.WriteString("gpucheck: cuda=fail:CUDA driver version is insufficient for CUDA runtime version\n")
		return []byte(out.String()), nil
	case env["CUDA_MPS_PIPE_DIRECTORY"] != "" && !pipeMounted:
		out.WriteString("gpucheck: cuda=fail:MPS client failed to connect to the MPS control daemon or the MPS server\n")
		return []byte(out.String()), nil
	case !f.anyUser && !daemonServes(env["CUDA_MPS_PIPE_DIRECTORY"], spec.Process.User.UID):
		out.WriteString("gpucheck: cuda=fail:MPS client failed to connect to the MPS control daemon or the MPS server\n")
		return []byte(out.String()), nil
	}
	if v := env["NVIDIA_VISIBLE_DEVICES"]; strings.HasPrefix(v, "MIG-") {
		caps := 0
		for n := range nodes {
			if strings.HasPrefix(n, "/dev/nvidia-caps/") {
				caps++
			}
		}
		if caps < 2 {
			out.WriteString("gpucheck: cuda=fail:no CUDA-capable device is detected\n")
			return []byte(out.String()), nil
		}
		fmt.Fprintf(&out, "gpucheck: devices=1\ngpucheck: uuid.0=GPU-%s\ngpucheck: mem.0=%d\ngpucheck: kernel=ok\n", strings.TrimPrefix(v, "MIG-"), f.migMemoryBytes)
		return []byte(out.String()), nil
	}
	var visible []topology.GPU
	for _, g := range f.gpus {
		if nodes[fmt.Sprintf("/dev/nvidia%d", g.Minor)] {
			visible = append(visible, g)
		}
	}
	fmt.Fprintf(&out, "gpucheck: devices=%d\n", len(visible))
	for i, g := range visible {
		fmt.Fprintf(&out, "gpucheck: uuid.%d=%s\n", i, g.UUID)
	}
	if len(visible) == 0 {
		return []byte(out.String()), nil
	}
	out.WriteString("gpucheck: kernel=ok\n")
	if allocMiB > 0 {
		limit := visible[0].MemoryBytes / mib
		if l, ok := env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; ok {
			v := strings.TrimSuffix(strings.TrimPrefix(l, "0="), "M")
			if n, err := strconv.ParseInt(v, 10, 64); err == nil {
				limit = n
			}
		}
		if f.serverLimitMiB > 0 {
			limit = min(limit, f.serverLimitMiB)
		}
		if allocMiB <= limit {
			out.WriteString("gpucheck: alloc=ok\n")
		} else {
			out.WriteString("gpucheck: alloc=fail:out of memory\n")
		}
	}
	out.WriteString(f.fakeSpin(env, args))
	return []byte(out.String()), nil
}

// fakeDiscoverer returns a fixed topology.
type fakeDiscoverer struct{ topo *topology.Topology }

func (f fakeDiscoverer) Discover(context.Context) (*topology.Topology, error) { return f.topo, nil }
