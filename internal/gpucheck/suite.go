package gpucheck

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// Config is one run of the suite.
type Config struct {
	// DryRun runs the parts that need no GPU: discovery from the go-nvml
	// mock, prepare, CDI injection and a shell probe under runc. Checks
	// that need a GPU are skipped with the reason.
	DryRun bool
	// WorkDir holds CDI specs, MPS directories, bundles and the probe.
	WorkDir  string
	NodeName string
	// GPUIndex is the GPU the claims are for.
	GPUIndex int
	// ShareMemoryBytes and ShareCores size the share claim.
	ShareMemoryBytes int64
	ShareCores       int64
	// Programs; names without a slash are looked up in PATH.
	Runc, NVIDIASMI, NVCC string
	// ContainerTimeout bounds each container run.
	ContainerTimeout time.Duration
	// Work is the fixed work of the throughput checks (DefaultWork when
	// Reps is 0); StartLead how far ahead of now the containers of one
	// check are told to start it together (5 s when 0).
	Work      Work
	StartLead time.Duration
	// DaemonDriverRoot is the driver root (host path) the MPS daemon pods
	// of the daemon pod rows mount and run nvidia-cuda-mps-control from;
	// empty skips those rows.
	DaemonDriverRoot string
}

// Deps are what the suite talks to.
type Deps struct {
	Run        Runner
	Discoverer discovery.Discoverer
	// NewPreparer builds the plugin's prepare code once discovery worked.
	NewPreparer func(ctx context.Context) (Preparer, error)
	// NewMIGPreparer builds the plugin's prepare code with the GPU of
	// gpuIndex partitioned on demand (--mig-on-demand), and MIG lists
	// GPU instances through NVML; the MIG rows (mig.go) need both, and
	// are skipped without them.
	NewMIGPreparer func(ctx context.Context, gpuIndex int) (Preparer, error)
	MIG            MIGLister
	// Processes lists the processes whose environment names an MPS pipe
	// directory (the daemon and its servers); nil scans /proc.
	Processes func(pipeDir string) ([]int, error)
	// NewPreparerWithDaemon builds the plugin's prepare code with its
	// state under workDir and its MPS daemons started by daemon (the daemon
	// pod rows: mps.PodDaemon); nil skips those rows.
	NewPreparerWithDaemon func(ctx context.Context, workDir string, daemon mps.Daemon) (Preparer, error)
	// Stat stats device nodes for the daemon pods (DryRunStat in a dry
	// run); nil is os.Stat.
	Stat func(string) (fs.FileInfo, error)
}

// ErrNoGPU is returned by CheckHost on a host without an NVIDIA GPU and
// driver.
var ErrNoGPU = errors.New("no NVIDIA GPU/driver found")

// CheckHost fails fast where the suite cannot run on a GPU: no
// /dev/nvidiactl (no driver loaded) or no nvidia-smi.
func CheckHost(stat func(string) (fs.FileInfo, error), lookPath func(string) (string, error), nvidiaSMI string) error {
	var why []string
	if _, err := stat("/dev/nvidiactl"); err != nil {
		why = append(why, fmt.Sprintf("/dev/nvidiactl: %v (is the NVIDIA kernel module loaded?)", err))
	}
	if _, err := lookPath(nvidiaSMI); err != nil {
		why = append(why, fmt.Sprintf("%s: %v", nvidiaSMI, err))
	}
	if len(why) > 0 {
		return fmt.Errorf("%w: %s; run this on a Linux host with an NVIDIA GPU and driver, or use --dry-run for the GPU-less checks", ErrNoGPU, strings.Join(why, "; "))
	}
	return nil
}

// Check names of the claim and container checks.
const (
	CheckDiscovery       = "discovery: NVML"
	CheckProbeBuild      = "probe: nvcc build"
	CheckPrepareWhole    = "prepare: whole-GPU claim -> CDI"
	CheckPrepareShare    = "prepare: MPS share claim -> CDI"
	CheckContainerWhole  = "container: whole GPU, host rootfs"
	CheckContainerCDI    = "container: whole GPU, CDI-only rootfs"
	CheckContainerShare  = "container: MPS share"
	CheckAllocBelow      = "MPS: alloc below the limit works"
	CheckAllocAbove      = "MPS: alloc past the limit fails"
	CheckAllocRewritten  = "MPS: alloc past the limit fails, env rewritten"
	CheckUnprepareWhole  = "unprepare: whole-GPU claim"
	CheckUnprepareShare  = "unprepare: MPS share claim"
	CheckPrepareShare2   = "prepare: MPS shares of two GPUs -> CDI"
	CheckContainerShare2 = "container: MPS shares of two GPUs"
	CheckUnprepareShare2 = "unprepare: MPS shares of two GPUs"
	dryRunReason         = "dry run: needs a GPU"
	defaultContainerWait = 2 * time.Minute
)

// Run runs the suite and returns its table; it never stops at the first
// failure, so one run shows everything that is wrong.
func Run(ctx context.Context, cfg Config, deps Deps) *Report {
	s := &suite{cfg: cfg, deps: deps, rep: &Report{}}
	if s.cfg.ContainerTimeout <= 0 {
		s.cfg.ContainerTimeout = defaultContainerWait
	}
	s.run(ctx)
	return s.rep
}

type suite struct {
	cfg  Config
	deps Deps
	rep  *Report
	// program and args run in every container; probeArgs are appended.
	program string
	args    []string
	n       int
}

func (s *suite) run(ctx context.Context) {
	topo, err := s.deps.Discoverer.Discover(ctx)
	if err != nil {
		s.rep.Add(CheckDiscovery, Fail, "%v", err)
		return
	}
	s.rep.Add(CheckDiscovery, Pass, "%d GPU(s)%s", topo.Len(), map[bool]string{true: " (go-nvml mock, dry run)"}[s.cfg.DryRun])
	s.compareWithNVIDIASMI(ctx, topo)

	p, ok := topo.Position(s.cfg.GPUIndex)
	if !ok {
		s.rep.Add("claims: GPU", Fail, "no GPU with index %d on this host", s.cfg.GPUIndex)
		return
	}
	g := topo.GPUs[p]
	gpu := ClaimedGPU{Index: g.Index, Minor: g.Minor, UUID: g.UUID}

	if !s.prepareProgram(ctx) {
		return
	}
	prep, err := s.deps.NewPreparer(ctx)
	if err != nil {
		s.rep.Add(CheckPrepareWhole, Fail, "%v", err)
		return
	}
	s.wholeGPU(ctx, prep, gpu)
	s.share(ctx, prep, gpu, g.MemoryBytes)
	s.sharingRows(ctx, prep, gpu)
	if topo.Len() < 2 {
		s.rep.Add(CheckPrepareShare2, Skip, "one GPU on this host; the claim needs two")
	} else {
		other := topo.GPUs[(p+1)%topo.Len()]
		s.shareTwo(ctx, prep, gpu, ClaimedGPU{Index: other.Index, Minor: other.Minor, UUID: other.UUID})
	}
	s.migRows(ctx, topo)
}

// shareTwo prepares a claim with an MPS share on each of two GPUs (one
// control daemon for both) and checks what its container gets: both GPUs
// and only them, one pinned memory limit per device ordinal, the claim's
// pipe directory, and, on a GPU, CUDA seeing both GPUs. It does not test
// the limits by allocating (CheckAlloc* do that for one GPU).
func (s *suite) shareTwo(ctx context.Context, prep Preparer, a, b ClaimedGPU) {
	claim := ShareClaimTwoGPUs(s.cfg.NodeName, a.Index, b.Index, s.cfg.ShareMemoryBytes, s.cfg.ShareCores)
	limitMiB := s.cfg.ShareMemoryBytes / mib
	ids, err := prep.Prepare(ctx, claim)
	if err != nil {
		s.rep.Add(CheckPrepareShare2, Fail, "%v", err)
		return
	}
	defer s.unprepare(ctx, prep, claim, ids, CheckUnprepareShare2)
	s.rep.Add(CheckPrepareShare2, Pass, "GPUs %d and %d, %d MiB each, %d%% SMs: %s", a.Index, b.Index, limitMiB, s.cfg.ShareCores, strings.Join(ids, ","))
	r, err := s.container(ctx, prep, ids, RootfsHost)
	if err != nil {
		s.rep.Add(CheckContainerShare2, Fail, "%v", err)
		return
	}
	errs := CheckIsolationOf(r, []ClaimedGPU{a, b})
	if r.Env["CUDA_MPS_PIPE_DIRECTORY"] == "" {
		errs = append(errs, "no CUDA_MPS_PIPE_DIRECTORY")
	}
	if got, want := r.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"], fmt.Sprintf("0=%dM,1=%dM", limitMiB, limitMiB); got != want {
		errs = append(errs, fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want %q", got, want))
	}
	if !s.cfg.DryRun {
		errs = append(errs, CheckCUDAOf(r, []ClaimedGPU{a, b})...)
	}
	seen := "NVIDIA_VISIBLE_DEVICES=" + r.Env["NVIDIA_VISIBLE_DEVICES"] + "; CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=" + r.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] + "; nodes " + strings.Join(r.DevNodes, ",")
	s.rep.Add(CheckContainerShare2, statusOf(errs), "%s", detailOf(errs, seen))
}

// compareWithNVIDIASMI runs the two nvidia-smi queries and compares.
func (s *suite) compareWithNVIDIASMI(ctx context.Context, topo *topology.Topology) {
	if s.cfg.DryRun {
		for _, name := range []string{CheckSMIGPUs, CheckSMIMemory, CheckSMIBusIDs, CheckTopoGPUs, CheckTopoLinks} {
			s.rep.Add(name, Skip, "dry run: no nvidia-smi (the comparison is unit-tested on fixtures)")
		}
		return
	}
	out, err := s.deps.Run(ctx, s.cfg.NVIDIASMI, QueryGPUArgs...)
	var smi []SMIGPU
	if err == nil {
		smi, err = ParseQueryGPU(strings.NewReader(string(out)))
	}
	if err != nil {
		for _, name := range []string{CheckSMIGPUs, CheckSMIMemory, CheckSMIBusIDs} {
			s.rep.Add(name, Fail, "%s %s: %v (output: %q)", s.cfg.NVIDIASMI, strings.Join(QueryGPUArgs, " "), err, strings.TrimSpace(string(out)))
		}
	} else {
		s.rep.AddAll(CompareQueryGPU(topo, smi)...)
	}
	out, err = s.deps.Run(ctx, s.cfg.NVIDIASMI, TopoArgs...)
	var smiTopo *topology.Topology
	if err == nil {
		smiTopo, err = topology.Parse(strings.NewReader(string(out)))
	}
	if err != nil {
		for _, name := range []string{CheckTopoGPUs, CheckTopoLinks} {
			s.rep.Add(name, Fail, "%s topo -m: %v", s.cfg.NVIDIASMI, err)
		}
		return
	}
	s.rep.AddAll(CompareTopo(topo, smiTopo)...)
}

// prepareProgram builds the CUDA probe with nvcc, or in a dry run picks
// the shell probe.
func (s *suite) prepareProgram(ctx context.Context) bool {
	if s.cfg.DryRun {
		sh, err := filepath.EvalSymlinks("/bin/sh")
		if err != nil {
			s.rep.Add(CheckProbeBuild, Fail, "dry run needs /bin/sh: %v", err)
			return false
		}
		s.program, s.args = sh, []string{"-c", ShellProbeScript}
		return true
	}
	src := filepath.Join(s.cfg.WorkDir, ProbeSourceName)
	bin := filepath.Join(s.cfg.WorkDir, "gpucheck-probe")
	if err := os.WriteFile(src, ProbeSource, 0o644); err != nil {
		s.rep.Add(CheckProbeBuild, Fail, "writing %s: %v", src, err)
		return false
	}
	out, err := s.deps.Run(ctx, s.cfg.NVCC, "-O2", "-o", bin, src)
	if err != nil {
		s.rep.Add(CheckProbeBuild, Fail, "%s -O2 -o %s %s: %v (output: %q); the container checks need the CUDA compiler on this host (--nvcc)", s.cfg.NVCC, bin, src, err, lastLines(out, 5))
		return false
	}
	s.rep.Add(CheckProbeBuild, Pass, "%s", bin)
	s.program = bin
	return true
}

func (s *suite) wholeGPU(ctx context.Context, prep Preparer, gpu ClaimedGPU) {
	claim := WholeClaim(s.cfg.NodeName, gpu.Index)
	ids, err := prep.Prepare(ctx, claim)
	if err != nil {
		s.rep.Add(CheckPrepareWhole, Fail, "%v", err)
		return
	}
	s.rep.Add(CheckPrepareWhole, Pass, "GPU %d (%s): %s", gpu.Index, gpu.UUID, strings.Join(ids, ","))
	for _, m := range []struct {
		name string
		mode RootfsMode
	}{{CheckContainerWhole, RootfsHost}, {CheckContainerCDI, RootfsCDIOnly}} {
		r, err := s.container(ctx, prep, ids, m.mode)
		if err != nil {
			s.rep.Add(m.name, Fail, "%v", err)
			continue
		}
		errs := CheckIsolation(r, gpu)
		if !s.cfg.DryRun {
			errs = append(errs, CheckCUDA(r, gpu)...)
		}
		s.rep.Add(m.name, statusOf(errs), "%s", detailOf(errs, s.seen(r, gpu)))
	}
	s.unprepare(ctx, prep, claim, ids, CheckUnprepareWhole)
}

// unprepare unprepares a claim and checks that its CDI devices are gone.
func (s *suite) unprepare(ctx context.Context, prep Preparer, claim *resourceapi.ResourceClaim, ids []string, name string) {
	// Also after an interrupt: an MPS daemon must not outlive the suite.
	ctx = context.WithoutCancel(ctx)
	if err := prep.Unprepare(ctx, claim); err != nil {
		s.rep.Add(name, Fail, "%v", err)
		return
	}
	if err := InjectCDI(&specs.Spec{Process: &specs.Process{}}, prep.SpecDirs(), ids); err == nil {
		s.rep.Add(name, Fail, "unprepare succeeded but %v still resolve in %v", ids, prep.SpecDirs())
		return
	}
	s.rep.Add(name, Pass, "%v no longer resolve", ids)
}

func (s *suite) share(ctx context.Context, prep Preparer, gpu ClaimedGPU, gpuMemory int64) {
	claim := ShareClaim(s.cfg.NodeName, gpu.Index, s.cfg.ShareMemoryBytes, s.cfg.ShareCores)
	limitMiB := s.cfg.ShareMemoryBytes / mib
	ids, err := prep.Prepare(ctx, claim)
	if err != nil {
		s.rep.Add(CheckPrepareShare, Fail, "%v", err)
		return
	}
	defer s.unprepare(ctx, prep, claim, ids, CheckUnprepareShare)
	s.rep.Add(CheckPrepareShare, Pass, "GPU %d, %d MiB, %d%% SMs: %s", gpu.Index, limitMiB, s.cfg.ShareCores, strings.Join(ids, ","))

	r, err := s.container(ctx, prep, ids, RootfsHost)
	if err != nil {
		s.rep.Add(CheckContainerShare, Fail, "%v", err)
	} else {
		errs := CheckIsolation(r, gpu)
		errs = append(errs, checkMPSEnv(r, limitMiB)...)
		if !s.cfg.DryRun {
			errs = append(errs, CheckCUDA(r, gpu)...)
		}
		s.rep.Add(CheckContainerShare, statusOf(errs), "%s", detailOf(errs, s.seen(r, gpu)))
	}

	below := max(limitMiB/4, 1)
	above := limitMiB + 1024
	rewritten := fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=%dM", max(gpuMemory/mib, above+1024))
	for _, a := range []struct {
		name   string
		mib    int64
		wantOK bool
		extra  []string
	}{
		{CheckAllocBelow, below, true, nil},
		{CheckAllocAbove, above, false, nil},
		{CheckAllocRewritten, above, false, []string{"--set-env", rewritten}},
	} {
		if s.cfg.DryRun {
			s.rep.Add(a.name, Skip, dryRunReason)
			continue
		}
		args := append([]string{"--alloc-mib", fmt.Sprint(a.mib)}, a.extra...)
		r, err := s.container(ctx, prep, ids, RootfsHost, args...)
		if err != nil {
			s.rep.Add(a.name, Fail, "%v", err)
			continue
		}
		errs := CheckAlloc(r, gpu, a.mib, a.wantOK)
		what := fmt.Sprintf("limit %d MiB, allocated %d MiB: %s", limitMiB, a.mib, r.Alloc)
		if a.extra != nil {
			what = fmt.Sprintf("container set %s; %s", rewritten, what)
			if len(errs) > 0 && r.Alloc == "ok" {
				errs = append(errs, "the limit is enforced on the client side only: a container that rewrites its environment gets more")
			}
		}
		if len(errs) > 0 {
			// The limit and the sizes are part of the finding.
			errs = append([]string{what}, errs...)
		}
		s.rep.Add(a.name, statusOf(errs), "%s", detailOf(errs, what))
	}
}

// checkMPSEnv checks the limits a share's container gets in its env.
func checkMPSEnv(r *ProbeReport, limitMiB int64) []string {
	var errs []string
	if r.Env["CUDA_MPS_PIPE_DIRECTORY"] == "" {
		errs = append(errs, "no CUDA_MPS_PIPE_DIRECTORY")
	}
	if got := r.Env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"]; !strings.Contains(got, fmt.Sprintf("=%dM", limitMiB)) {
		errs = append(errs, fmt.Sprintf("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=%q, want the share's %d MiB", got, limitMiB))
	}
	return errs
}

// seen summarizes a probe report for a passing row.
func (s *suite) seen(r *ProbeReport, gpu ClaimedGPU) string {
	var parts []string
	parts = append(parts, "NVIDIA_VISIBLE_DEVICES="+r.Env["NVIDIA_VISIBLE_DEVICES"])
	parts = append(parts, "nodes "+strings.Join(r.DevNodes, ","))
	if s.cfg.DryRun {
		parts = append(parts, "(dry run: fake device nodes, no CUDA)")
	} else {
		parts = append(parts, fmt.Sprintf("CUDA devices %v, kernel %s", r.UUIDs, r.Kernel))
	}
	return strings.Join(parts, "; ")
}

func statusOf(errs []string) Status {
	if len(errs) > 0 {
		return Fail
	}
	return Pass
}

func detailOf(errs []string, ok string) string {
	if len(errs) > 0 {
		return strings.Join(errs, "; ")
	}
	return ok
}

// lastLines is the tail of a program's output for an error message.
func lastLines(out []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}

// DryRunStat stats /dev/null in place of every /dev/nvidia* node, so that a
// dry run's CDI specs carry device nodes (harmless ones: runc creates them
// as 1:3 in the container) and the isolation check has nodes to count.
func DryRunStat(path string) (fs.FileInfo, error) {
	if strings.HasPrefix(path, "/dev/nvidia") {
		return os.Stat("/dev/null")
	}
	return os.Stat(path)
}
