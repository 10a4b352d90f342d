package gpucheck

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// container runs the probe in a container with the CDI devices injected.
func (s *suite) container(ctx context.Context, prep Preparer, ids []string, mode RootfsMode, extra ...string) (*ProbeReport, error) {
	b, err := s.bundle(prep, probeRun{ids: ids, mode: mode, args: extra})
	if err != nil {
		return nil, err
	}
	return s.runBundle(ctx, b)
}

// probeRun is one container of the probe: the claim's CDI devices, the
// root file system, the user and the probe's arguments.
type probeRun struct {
	ids  []string
	mode RootfsMode
	user specs.User
	args []string
}

// builtBundle is an OCI bundle ready for runc.
type builtBundle struct{ id, dir string }

// bundle writes the OCI bundle of one probe container.
func (s *suite) bundle(prep Preparer, p probeRun) (builtBundle, error) {
	s.n++
	id := fmt.Sprintf("gpucheck-%d-%d", os.Getpid(), s.n)
	dir := filepath.Join(s.cfg.WorkDir, "bundles", id)
	c := Container{ID: id, Program: s.program, Args: append(append([]string{}, s.args...), p.args...), Rootfs: p.mode, User: p.user}
	// The context only bounds ldd (CDI-only roots); a bundle is quick.
	if _, err := BuildBundle(context.Background(), s.deps.Run, dir, c, prep.SpecDirs(), p.ids); err != nil {
		return builtBundle{}, fmt.Errorf("building the OCI bundle: %w", err)
	}
	return builtBundle{id: id, dir: dir}, nil
}

// runBundle runs a bundle with runc and parses the probe's report.
func (s *suite) runBundle(ctx context.Context, b builtBundle) (*ProbeReport, error) {
	cctx, cancel := context.WithTimeout(ctx, s.cfg.ContainerTimeout)
	defer cancel()
	out, err := RunContainer(cctx, s.deps.Run, s.cfg.Runc, filepath.Join(s.cfg.WorkDir, "runc"), b.dir, b.id)
	if err != nil {
		return nil, fmt.Errorf("%w (output: %q)", err, lastLines(out, 8))
	}
	return ParseProbe(out)
}

// together runs one probe container per run at the same time (their
// bundles are built first) and returns their reports in order, or the
// errors of those that failed.
func (s *suite) together(ctx context.Context, prep Preparer, runs []probeRun) ([]*ProbeReport, error) {
	bundles := make([]builtBundle, len(runs))
	for i, p := range runs {
		b, err := s.bundle(prep, p)
		if err != nil {
			return nil, fmt.Errorf("container %d: %w", i+1, err)
		}
		bundles[i] = b
	}
	reports := make([]*ProbeReport, len(runs))
	errs := make([]error, len(runs))
	var wg sync.WaitGroup
	for i, b := range bundles {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.runBundle(ctx, b)
			if err != nil {
				err = fmt.Errorf("container %d: %w", i+1, err)
			}
			reports[i], errs[i] = r, err
		}()
	}
	wg.Wait()
	return reports, errors.Join(errs...)
}
