package gpucheck

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// Names of the daemon pod checks: an Isolated share's MPS control daemon
// run in the pod the plugin's mps.PodDaemon creates (podKubelet runs it),
// with a client of another user. The first is the chart's pod (root with
// CAP_SETUID and CAP_SETGID); the others run the same pod as the image's
// non-root user without capabilities, as the chart did before issue 35,
// and show why it changed: that daemon serves clients of its own user
// only.
const (
	CheckDaemonPodChart       = "MPS daemon pod as the chart runs it, client UID 1000"
	CheckDaemonPodNonRoot     = "MPS daemon pod as UID 65532, no caps: client UID 1000 refused"
	CheckDaemonPodNonRootSame = "MPS daemon pod as UID 65532, no caps: client UID 65532 served"
	// daemonPodClientTimeout bounds a client container: a client that
	// waits for a server its daemon cannot start must not hold the suite
	// for the default two minutes.
	daemonPodClientTimeout = 30 * time.Second
	daemonPodCores         = 30
	daemonPodReps          = 5
	clientUID              = 1000
	// mpsRefused is how CUDA fails a client that its daemon cannot serve.
	mpsRefused = "MPS client failed to connect"
)

// daemonPodCase is one way of running the daemon pod, with the user of
// the client container.
type daemonPodCase struct {
	name string
	// override is nil for the pod as mps.PodDaemon makes it.
	override  *daemonUser
	clientUID uint32
	// refused: the client must not get through (CUDA fails with
	// mpsRefused); else it must, with the share's limits.
	refused bool
}

var nonRootDaemon = &daemonUser{UID: imageUID, GID: imageGID}

var daemonPodCases = []daemonPodCase{
	{name: CheckDaemonPodChart, clientUID: clientUID},
	{name: CheckDaemonPodNonRoot, override: nonRootDaemon, clientUID: clientUID, refused: true},
	{name: CheckDaemonPodNonRootSame, override: nonRootDaemon, clientUID: imageUID},
}

// daemonPodRows runs every daemon pod case.
func (s *suite) daemonPodRows(ctx context.Context, gpu ClaimedGPU, base func() (Timing, bool)) {
	for i, c := range daemonPodCases {
		if s.deps.NewPreparerWithDaemon == nil || s.cfg.DaemonDriverRoot == "" {
			s.rep.Add(c.name, Skip, "no driver root for the daemon pods (--daemon-driver-root) or no preparer for them")
			continue
		}
		errs, seen := s.daemonPod(ctx, gpu, i+1, c, base)
		if len(errs) > 0 && seen != "" {
			errs = append(errs, seen)
		}
		s.rep.Add(c.name, statusOf(errs), "%s", detailOf(errs, seen))
	}
}

// daemonPod prepares a cores:30 share whose daemon runs in a pod, runs a
// client of c.clientUID in the share's container (an allocation past the
// memory limit and the fixed work), and unprepares it.
func (s *suite) daemonPod(ctx context.Context, gpu ClaimedGPU, n int, c daemonPodCase, base func() (Timing, bool)) ([]string, string) {
	stat := s.deps.Stat
	if stat == nil {
		stat = os.Stat
	}
	k := newPodKubelet(&podKubelet{
		run: s.deps.Run, runc: s.cfg.Runc, stateDir: filepath.Join(s.cfg.WorkDir, "runc"),
		workDir: filepath.Join(s.cfg.WorkDir, fmt.Sprintf("daemon-pod-%d", n)), stat: stat,
		minors: map[int]int{gpu.Index: gpu.Minor}, override: c.override,
		containerPrefix: fmt.Sprintf("gpucheck-%d-daemon-pod-%d", os.Getpid(), n),
	})
	root := s.cfg.DaemonDriverRoot
	pd, err := mps.NewPodDaemon(mps.PodDaemonConfig{
		Pods: k.cs.CoreV1(), Namespace: podNamespace, Image: "gpulink", NodeName: s.cfg.NodeName,
		DriverRoot: root, DriverRootMount: root, PollInterval: 200 * time.Millisecond, StartTimeout: 30 * time.Second,
	})
	if err != nil {
		return []string{err.Error()}, ""
	}
	pluginDir := filepath.Join(s.cfg.WorkDir, fmt.Sprintf("daemon-pod-%d", n), "plugin")
	prep, err := s.deps.NewPreparerWithDaemon(ctx, pluginDir, pd)
	if err != nil {
		return []string{err.Error()}, ""
	}
	claim := ShareClaimOf(s.cfg.NodeName, ShareSpec{Name: fmt.Sprintf("daemon-pod-%d", n), GPU: gpu.Index, MemoryBytes: s.cfg.ShareMemoryBytes, Cores: daemonPodCores})
	ids, err := prep.Prepare(ctx, claim)
	if err != nil {
		out, _ := k.lastOutput()
		return []string{fmt.Sprintf("prepare (the daemon pod's start): %v; daemon output: %q", err, out)}, ""
	}
	daemonUID := k.daemonUID()
	w := s.work()
	w.Reps = daemonPodReps
	limitMiB := s.cfg.ShareMemoryBytes / mib
	above := limitMiB + 1024
	b, err := s.bundle(prep, probeRun{ids: ids, mode: RootfsHost, user: specs.User{UID: c.clientUID, GID: c.clientUID},
		args: append([]string{"--alloc-mib", fmt.Sprint(above)}, w.args(time.Time{})...)})
	var r *ProbeReport
	if err == nil {
		r, err = s.runBundleWithin(ctx, b, daemonPodClientTimeout)
	}
	var errs []string
	var seen string
	switch {
	case err != nil:
		out, _ := k.lastOutput()
		errs = append(errs, fmt.Sprintf("client UID %d: %v; daemon: %s", c.clientUID, err, out))
	case s.cfg.DryRun:
		errs, seen = dryRunDaemonPod(r, daemonUID, c.clientUID)
	case c.refused:
		seen = fmt.Sprintf("daemon UID %d, client UID %d: CUDA: %s", daemonUID, c.clientUID, strings.TrimPrefix(r.CUDA, "fail:"))
		if !strings.Contains(r.CUDA, mpsRefused) {
			errs = append(errs, fmt.Sprintf("the client was not refused (CUDA %q, kernel %q, allocation %q): a daemon of UID %d without capabilities served a client of UID %d", r.CUDA, r.Kernel, r.Alloc, daemonUID, c.clientUID))
		}
	default:
		errs, seen = s.daemonPodVerdict(r, gpu, w, above, limitMiB, daemonUID, c.clientUID, base)
	}
	if len(errs) > 0 && !s.cfg.DryRun {
		// The MPS logs say why; unprepare removes them.
		errs = append(errs, mpsLogTails(filepath.Join(pluginDir, "mps", string(claim.UID), "log"))...)
	}
	errs = append(errs, s.unprepareErrs(ctx, prep, claim)...)
	if k.running() > 0 {
		errs = append(errs, "the daemon pod's container still runs after unprepare")
	}
	return errs, seen
}

// daemonPodVerdict: the client of another user ran through the daemon
// with the share's limits: the allocation past the memory limit failed,
// the fixed work ran at about the share's cores.
func (s *suite) daemonPodVerdict(r *ProbeReport, gpu ClaimedGPU, w Work, above, limitMiB int64, daemonUID, clientUID uint32, base func() (Timing, bool)) ([]string, string) {
	errs := CheckAlloc(r, gpu, above, false)
	if len(errs) > 0 && r.Alloc == "ok" {
		errs = append(errs, "the client ran without the share's memory limit (not through the daemon?)")
	}
	seen := fmt.Sprintf("daemon UID %d, client UID %d: %d MiB past a %d MiB limit: %s", daemonUID, clientUID, above, limitMiB, r.Alloc)
	t, err := TimingOf("client", r, w)
	if err != nil {
		return append(errs, err.Error()), seen
	}
	whole, ok := base()
	if !ok {
		return append(errs, errNoBaselineMeasured), seen
	}
	pct, smErrs := CheckSMShare(whole, t, daemonPodCores)
	errs = append(errs, smErrs...)
	return errs, seen + fmt.Sprintf("; cores %d: %.1f %% of the whole GPU", daemonPodCores, pct)
}

// dryRunDaemonPod checks what a dry run shows: the stand-in daemon ran as
// the pod's user and could write its directories (DryRunMPSControl), and
// the client got the claim's pipe directory.
func dryRunDaemonPod(r *ProbeReport, daemonUID, clientUID uint32) ([]string, string) {
	pipe := r.Env["CUDA_MPS_PIPE_DIRECTORY"]
	if pipe == "" {
		return []string{"the client got no CUDA_MPS_PIPE_DIRECTORY"}, ""
	}
	var errs []string
	log := filepath.Join(groupDir(pipe), "log", "control.log")
	b, err := os.ReadFile(log)
	switch {
	case err != nil:
		errs = append(errs, fmt.Sprintf("the stand-in daemon's log: %v", err))
	case !strings.Contains(string(b), fmt.Sprintf("uid %d\n", daemonUID)):
		errs = append(errs, fmt.Sprintf("the stand-in daemon's log %s says %q, want uid %d", log, strings.TrimSpace(string(b)), daemonUID))
	}
	return errs, fmt.Sprintf("dry run: the stand-in daemon ran as UID %d and made its control pipe; client UID %d got the pipe directory (no CUDA)", daemonUID, clientUID)
}

// mpsLogTails are the ends of the MPS control daemon's and server's logs.
func mpsLogTails(dir string) []string {
	var tails []string
	for _, name := range []string{"control.log", "server.log"} {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil || len(b) == 0 {
			continue
		}
		tails = append(tails, fmt.Sprintf("%s ends with: %q", name, lastLines(b, 4)))
	}
	return tails
}

// runBundleWithin is runBundle with its own time limit.
func (s *suite) runBundleWithin(ctx context.Context, b builtBundle, limit time.Duration) (*ProbeReport, error) {
	cctx, cancel := context.WithTimeout(ctx, min(limit, s.cfg.ContainerTimeout))
	defer cancel()
	return s.runBundle(cctx, b)
}

// DryRunMPSControl stands in for nvidia-cuda-mps-control in a dry run's
// driver root (WriteDryRunDriverRoot), so that the daemon pod rows run
// the daemon's pod under runc without a GPU: with -f (the pod's command)
// it does what the daemon needs its user for, writing its log and its
// control pipe (a file here) into the claim's directories, and waits for
// quit; without, it is the control client: it answers when the control
// pipe is there, and quit ends the daemon.
const DryRunMPSControl = `#!/bin/sh
p="$CUDA_MPS_PIPE_DIRECTORY"
if [ "$1" = -f ]; then
	echo "stand-in MPS control daemon, uid $(id -u)" >"$CUDA_MPS_LOG_DIRECTORY/control.log" || exit 1
	: >"$p/control" || exit 1
	while [ ! -e "$p/quit" ] && [ -d "$p" ]; do sleep 0.1; done
	exit 0
fi
read -r cmd
[ -e "$p/control" ] || { echo "Cannot find MPS control daemon process"; exit 1; }
[ "$cmd" = quit ] && : >"$p/quit"
exit 0
`

// WriteDryRunDriverRoot makes a driver root under dir that mps.PodDaemon
// accepts (usr/bin/nvidia-cuda-mps-control, a libcuda.so.1) with
// DryRunMPSControl as the control program.
func WriteDryRunDriverRoot(dir string) error {
	for _, f := range []struct {
		path, text string
		mode       os.FileMode
	}{
		{"usr/bin/" + mps.ControlBinary, DryRunMPSControl, 0o755},
		{"usr/lib/x86_64-linux-gnu/libcuda.so.1", "", 0o644},
	} {
		p := filepath.Join(dir, f.path)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return fmt.Errorf("dry run driver root: %w", err)
		}
		if err := os.WriteFile(p, []byte(f.text), f.mode); err != nil {
			return fmt.Errorf("dry run driver root: %w", err)
		}
	}
	return nil
}

// lastOutput is the daemon container's output once it ended.
func (k *podKubelet) lastOutput() (string, bool) {
	k.mu.Lock()
	defer k.mu.Unlock()
	ps := make([]*runningPod, 0, 1)
	for _, p := range k.pods {
		ps = append(ps, p)
	}
	if len(ps) == 0 && k.last != nil {
		ps = append(ps, k.last) // a failed start deleted its pod
	}
	for _, p := range ps {
		select {
		case <-p.done:
			return strings.TrimSpace(lastLines(p.out, 6)) + fmt.Sprintf(" (%v)", p.err), true
		default:
			return "still running", true
		}
	}
	return "no pod", false
}

// daemonUID is the user the (one) daemon pod's container runs as.
func (k *podKubelet) daemonUID() uint32 {
	k.mu.Lock()
	defer k.mu.Unlock()
	for _, p := range k.pods {
		return p.uid
	}
	return 0
}

// running is the number of daemon containers not yet stopped.
func (k *podKubelet) running() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.pods)
}
