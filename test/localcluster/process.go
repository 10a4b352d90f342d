package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// process is one component the cluster started.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	logFile *os.File
	done    chan struct{} // closed when the process has exited
	waitErr error         // valid after done is closed
}

// startProcess starts bin with args, its stdout and stderr going to
// <Dir>/logs/<name>.log. The process gets SIGKILL when the thread that
// started it dies, so a crashed test leaves no control plane behind.
func (c *Cluster) startProcess(name, bin string, args ...string) (*process, error) {
	logPath := filepath.Join(c.dir, "logs", name+".log")
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("starting %s: opening log: %w", name, err)
	}
	fmt.Fprintf(logFile, "+ %s %s\n", bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.Dir = c.dir
	// containerd finds containerd-shim-runc-v2 through PATH.
	cmd.Env = append(os.Environ(), "PATH="+c.binDir+string(os.PathListSeparator)+os.Getenv("PATH"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s (%s): %w", name, bin, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, logFile: logFile, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	c.procs = append(c.procs, p)
	c.saveState()
	c.logf("started %s (pid %d), log %s", name, cmd.Process.Pid, logPath)
	return p, nil
}

func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace, then sends SIGKILL.
func (p *process) stop(grace time.Duration) error {
	defer p.logFile.Close()
	if p.exited() {
		return nil
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("stopping %s (pid %d): still running after SIGKILL", p.name, p.cmd.Process.Pid)
	}
}

// failure returns an error about p that carries the tail of its log.
func (p *process) failure(format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	if p.exited() {
		msg += fmt.Sprintf(" (%s exited: %v)", p.name, p.waitErr)
	}
	return fmt.Errorf("%s\n--- last lines of %s ---\n%s", msg, p.logPath, TailFile(p.logPath, 40))
}

// TailFile returns the last n lines of the (log) file at path, reading at
// most its last 16 KiB, or a note saying why it could not be read. Tests
// and the demo print it when a component fails.
func TailFile(path string, n int) string {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	defer f.Close()
	const maxBytes = 16 << 10
	if fi, err := f.Stat(); err == nil && fi.Size() > maxBytes {
		if _, err := f.Seek(-maxBytes, io.SeekEnd); err != nil {
			return fmt.Sprintf("(cannot read log: %v)", err)
		}
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(cannot read log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// waitFor polls cond every 100ms until it returns true, the process p (if not
// nil) exits, ctx ends or timeout passes. The last error cond returned is
// part of the error on failure.
func waitFor(ctx context.Context, p *process, timeout time.Duration, what string, cond func(ctx context.Context) (bool, error)) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var lastErr error
	ticker := time.NewTicker(100 * time.Millisecond)
	defer ticker.Stop()
	for {
		ok, err := cond(ctx)
		if ok {
			return nil
		}
		if err != nil {
			lastErr = err
		}
		if p != nil && p.exited() {
			return p.failure("waiting for %s", what)
		}
		select {
		case <-ctx.Done():
			msg := fmt.Sprintf("waiting for %s: %v", what, ctx.Err())
			if lastErr != nil {
				msg += fmt.Sprintf(" (last error: %v)", lastErr)
			}
			if p != nil {
				return p.failure("%s", msg)
			}
			return errors.New(msg)
		case <-ticker.C:
		}
	}
}

// reservePorts returns n distinct TCP ports that are free on 127.0.0.1 and
// reserved against other local clusters until the returned lock files are
// closed. Ports come from below the kernel's ephemeral range when there is
// room, so outgoing connections cannot take them between the choice and the
// component binding them; a flock on <tmp>/gpulink-localcluster-ports/<port>
// keeps concurrent Starts (other test packages, a developer's cluster) off
// the same ports, and the kernel drops the lock when its holder dies.
func reservePorts(n int) ([]int, []*os.File, error) {
	lockDir := filepath.Join(os.TempDir(), "gpulink-localcluster-ports")
	if err := os.MkdirAll(lockDir, 0o777); err != nil {
		return nil, nil, fmt.Errorf("reserving ports: %w", err)
	}
	_ = os.Chmod(lockDir, 0o1777)
	lo, hi := 10000, ephemeralPortStart()-1
	var ports []int
	var locks []*os.File
	release := func() {
		for _, f := range locks {
			f.Close()
		}
	}
	for attempts := 0; len(ports) < n; attempts++ {
		if attempts > 2000 {
			release()
			return nil, nil, fmt.Errorf("reserving ports: no %d free ports found on 127.0.0.1", n)
		}
		var port int
		if hi-lo >= 1000 {
			port = lo + rand.IntN(hi-lo+1)
		} else {
			// No room below the ephemeral range: let the kernel pick.
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				release()
				return nil, nil, fmt.Errorf("reserving ports: %w", err)
			}
			port = l.Addr().(*net.TCPAddr).Port
			l.Close()
		}
		if slices.Contains(ports, port) {
			continue
		}
		f, err := os.OpenFile(filepath.Join(lockDir, strconv.Itoa(port)), os.O_CREATE|os.O_RDWR, 0o666)
		if err != nil {
			release()
			return nil, nil, fmt.Errorf("reserving ports: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			f.Close() // held by another cluster
			continue
		}
		if !portFree(port) {
			f.Close()
			continue
		}
		ports = append(ports, port)
		locks = append(locks, f)
	}
	return ports, locks, nil
}

// portFree reports whether port can be bound on 127.0.0.1 and on all
// addresses (the kubelet serves on the node IP).
func portFree(port int) bool {
	for _, addr := range []string{"127.0.0.1", "0.0.0.0"} {
		l, err := net.Listen("tcp4", net.JoinHostPort(addr, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// ephemeralPortStart returns the first port of the kernel's ephemeral
// (automatically assigned) range.
func ephemeralPortStart() int {
	data, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(data))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// processesMatching returns the PIDs of processes (other than this one) whose
// command line contains needle.
func processesMatching(needle string) []int {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var pids []int
	self := os.Getpid()
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		if bytes.Contains(cmdline, []byte(needle)) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// killMatching sends SIGKILL to every process whose command line contains
// needle and waits up to 10s for them to be gone.
func killMatching(needle string) error {
	pids := processesMatching(needle)
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	deadline := time.Now().Add(10 * time.Second)
	for len(pids) > 0 {
		var alive []int
		for _, pid := range pids {
			if processAlive(pid) {
				alive = append(alive, pid)
			}
		}
		pids = alive
		if len(pids) == 0 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("processes %v (command line containing %s) survive SIGKILL", pids, needle)
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}

// processAlive reports whether pid exists and is not a zombie.
func processAlive(pid int) bool {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the parenthesised command name.
	s := string(data)
	if i := strings.LastIndexByte(s, ')'); i >= 0 && i+2 < len(s) {
		return s[i+2] != 'Z'
	}
	return true
}
