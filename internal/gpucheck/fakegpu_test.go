package gpucheck

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// fakeSpin is what the fake GPU's probe prints for --spin-reps: the work
// takes spinMS per repetition on the whole GPU, 100/cores times that in a
// client with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=cores. A priority 1 client
// of a Concurrent group (a pipe directory of a group) whose clients raised
// their percentage to 100 ends twice as late as its own repetitions say:
// it waited for the priority 0 client. Clients start at --start-at.
func (f *fakeHost) fakeSpin(env map[string]string, args []string) string {
	var reps int
	var startAt float64
	for i := 0; i+1 < len(args); i++ {
		switch args[i] {
		case "--spin-reps":
			reps, _ = strconv.Atoi(args[i+1])
		case "--start-at":
			startAt, _ = strconv.ParseFloat(args[i+1], 64)
		}
	}
	if reps == 0 {
		return ""
	}
	base := f.spinMS
	if base == 0 {
		base = 100
	}
	cores := 100.0
	if c, err := strconv.ParseFloat(env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"], 64); err == nil {
		cores = c
	}
	ms := base * 100 / cores
	start := startAt
	if start == 0 {
		start = float64(time.Now().UnixMilli())
	}
	elapsed := float64(reps) * ms
	if !f.noPriority && env["CUDA_MPS_CLIENT_PRIORITY"] == "1" && cores == 100 && strings.Contains(env["CUDA_MPS_PIPE_DIRECTORY"], "-gpu-") {
		elapsed *= 2
	}
	times := make([]string, reps)
	for i := range times {
		times[i] = fmt.Sprintf("%.3f", ms)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "gpucheck: sms=%d\n", int(132*cores/100))
	fmt.Fprintf(&b, "gpucheck: spin.start=%.3f\n", start+1)
	if startAt > 0 {
		b.WriteString("gpucheck: spin.late=1.000\n")
	}
	fmt.Fprintf(&b, "gpucheck: spin.end=%.3f\ngpucheck: spin.ms=%s\ngpucheck: spin=ok\n", start+1+elapsed, strings.Join(times, ","))
	return b.String()
}

// daemonPod plays a daemon pod's container (nvidia-cuda-mps-control -f):
// it fails like the daemon does when its user cannot write its pipe or
// log directory, else makes its control pipe (a file, as the dry run's
// stand-in control client expects) and runs until runc kill.
func (f *fakeHost) daemonPod(id string, spec *specs.Spec) ([]byte, error) {
	env := map[string]string{}
	for _, kv := range spec.Process.Env {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	u := spec.Process.User
	for _, dir := range []string{env["CUDA_MPS_PIPE_DIRECTORY"], env["CUDA_MPS_LOG_DIRECTORY"]} {
		if !writableBy(dir, u.UID, spec.Process.Capabilities.Effective) {
			return []byte(fmt.Sprintf("cannot create files in %s as uid %d", dir, u.UID)), fmt.Errorf("exit status 1")
		}
	}
	if err := os.WriteFile(filepath.Join(env["CUDA_MPS_LOG_DIRECTORY"], "control.log"), []byte(fmt.Sprintf("fake daemon, uid %d\n", u.UID)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(env["CUDA_MPS_PIPE_DIRECTORY"], "control"), nil, 0o644); err != nil {
		return nil, err
	}
	f.mu.Lock()
	if f.killed == nil {
		f.killed = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	f.killed[id] = ch
	f.daemonUsers = append(f.daemonUsers, u.UID)
	f.mu.Unlock()
	<-ch
	return []byte("killed"), fmt.Errorf("signal: killed")
}

// kill ends a fake daemon pod's container.
func (f *fakeHost) kill(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ch, ok := f.killed[id]; ok {
		close(ch)
		delete(f.killed, id)
	}
}

// writableBy tells whether a process of uid with the capabilities caps
// may create files in dir: the owner with the owner's write bit, others
// with the others' bit, or CAP_DAC_OVERRIDE.
func writableBy(dir string, uid uint32, caps []string) bool {
	fi, err := os.Stat(dir)
	if err != nil {
		return false
	}
	if slices.Contains(caps, "CAP_DAC_OVERRIDE") {
		return true
	}
	st := fi.Sys().(*syscall.Stat_t)
	if st.Uid == uid {
		return fi.Mode().Perm()&0o200 != 0
	}
	return fi.Mode().Perm()&0o002 != 0
}

// daemonServes tells whether the fake daemon pod of a pipe directory, if
// there is one (its control.log says its user), can start a server for a
// client of uid: a daemon that is not root only for its own user, as a
// GPU showed (docs/mps.md).
func daemonServes(pipe string, uid uint32) bool {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(pipe), "log", "control.log"))
	if err != nil {
		return true // a host daemon (root), or none
	}
	var daemon uint32
	if _, err := fmt.Sscanf(string(b), "fake daemon, uid %d", &daemon); err != nil {
		return true
	}
	return daemon == 0 || daemon == uid
}
