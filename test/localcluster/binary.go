package localcluster

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Binary is a gpulink binary a test runs as a user would (the built
// controller, kubelet plugin, webhook), its output in a log file.
type Binary struct {
	Name, Log string
	cmd       *exec.Cmd
	done      chan struct{}
	err       error
}

// StartBinary runs bin with args, output to <logDir>/<name>.log. Cleanup
// stops it (SIGTERM, then SIGKILL after 15 s) and, when the test failed,
// prints the log's tail.
func StartBinary(t *testing.T, logDir, name, bin string, args ...string) *Binary {
	t.Helper()
	logPath := filepath.Join(logDir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		t.Fatalf("starting %s: %v", name, err)
	}
	p := &Binary{Name: name, Log: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		f.Close()
		close(p.done)
	}()
	t.Cleanup(func() {
		p.Stop(t)
		if t.Failed() {
			t.Logf("last lines of %s (%s):\n%s", name, logPath, TailFile(logPath, 40))
		}
	})
	t.Logf("started %s (pid %d, log %s)", name, cmd.Process.Pid, logPath)
	return p
}

// Exited tells whether the process has ended.
func (p *Binary) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Stop ends the process: SIGTERM, then SIGKILL after 15 s (an error of
// the test, as a binary must stop on SIGTERM).
func (p *Binary) Stop(t *testing.T) {
	if p.Exited() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		t.Errorf("%s did not stop within 15 s of SIGTERM; killing it", p.Name)
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// Alive returns an error with the log's tail once the process has exited.
func (p *Binary) Alive() error {
	if p.Exited() {
		return fmt.Errorf("%s exited (%v); last lines of %s:\n%s", p.Name, p.err, p.Log, TailFile(p.Log, 30))
	}
	return nil
}

// WaitHTTP waits until url answers 200 while the process runs.
func (p *Binary) WaitHTTP(ctx context.Context, url string, timeout time.Duration) error {
	hc := &http.Client{Timeout: 2 * time.Second}
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		if err := p.Alive(); err != nil {
			return false, err
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return false, err
		}
		resp, err := hc.Do(req)
		if err != nil {
			last = err
			return false, nil
		}
		resp.Body.Close()
		last = fmt.Errorf("GET %s: %s", url, resp.Status)
		return resp.StatusCode == http.StatusOK, nil
	})
	if err != nil {
		return fmt.Errorf("waiting for %s: %w (last: %v)", url, err, last)
	}
	return nil
}
