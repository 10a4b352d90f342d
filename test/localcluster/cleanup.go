package localcluster

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// state is what Cleanup needs to undo a cluster whose owner died without
// calling Stop. It is kept in <Dir>/state.json.
type state struct {
	PIDs             []int  `json:"pids"`
	CgroupRoot       string `json:"cgroupRoot,omitempty"`
	ContainerdSocket string `json:"containerdSocket,omitempty"`
}

func (c *Cluster) saveState() {
	st := state{CgroupRoot: c.cgroupRoot}
	if c.opts.RealNode {
		st.ContainerdSocket = c.containerdSocket
	}
	for _, p := range c.procs {
		st.PIDs = append(st.PIDs, p.cmd.Process.Pid)
	}
	data, err := json.MarshalIndent(st, "", "  ")
	if err == nil {
		err = os.WriteFile(filepath.Join(c.dir, "state.json"), data, 0o644)
	}
	if err != nil {
		c.logf("warning: writing %s/state.json: %v", c.dir, err)
	}
}

// Cleanup undoes what a cluster with state directory dir left behind when
// its owner died without Stop: it kills the recorded components (only
// processes whose command line still names dir), the containerd shims of its
// containerd, processes left in its cgroups, removes those cgroups and
// lazily unmounts everything mounted under dir. It does not remove dir. It
// is a no-op for a directory that never held a cluster.
func Cleanup(dir string) error {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return fmt.Errorf("cleaning up local cluster: %w", err)
	}
	var st state
	data, err := os.ReadFile(filepath.Join(dir, "state.json"))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return unmountUnder(dir)
	case err != nil:
		return fmt.Errorf("cleaning up local cluster in %s: %w", dir, err)
	}
	if err := json.Unmarshal(data, &st); err != nil {
		return fmt.Errorf("cleaning up local cluster in %s: parsing state.json: %w", dir, err)
	}
	var errs []error
	for _, pid := range st.PIDs {
		cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err == nil && strings.Contains(string(cmdline), dir) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	if st.ContainerdSocket != "" {
		if err := killMatching(st.ContainerdSocket); err != nil {
			errs = append(errs, err)
		}
	}
	if st.CgroupRoot != "" {
		if err := removeCgroups(st.CgroupRoot); err != nil {
			errs = append(errs, err)
		}
	}
	if err := unmountUnder(dir); err != nil {
		errs = append(errs, err)
	}
	if err := removeContainerLogLinks(dir); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// containerLogLinkDir is where the kubelet links container logs, whatever
// its podLogsDir.
const containerLogLinkDir = "/var/log/containers"

// removeContainerLogLinks removes the kubelet's symbolic links in
// /var/log/containers that point into dir.
func removeContainerLogLinks(dir string) error {
	entries, err := os.ReadDir(containerLogLinkDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("listing %s: %w", containerLogLinkDir, err)
	}
	var errs []error
	for _, e := range entries {
		p := filepath.Join(containerLogLinkDir, e.Name())
		target, err := os.Readlink(p)
		if err != nil || !strings.HasPrefix(target, dir+"/") {
			continue
		}
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("removing container log link: %w", err))
		}
	}
	return errors.Join(errs...)
}

// mountinfo returns the fields of each line of /proc/self/mountinfo.
func mountinfo() ([][]string, error) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	defer f.Close()
	var lines [][]string
	s := bufio.NewScanner(f)
	s.Buffer(make([]byte, 64<<10), 1<<20)
	for s.Scan() {
		lines = append(lines, strings.Fields(s.Text()))
	}
	if err := s.Err(); err != nil {
		return nil, fmt.Errorf("reading mounts: %w", err)
	}
	return lines, nil
}

// mountPoints returns the mount points at or below dir, deepest first.
func mountPoints(dir string) ([]string, error) {
	lines, err := mountinfo()
	if err != nil {
		return nil, err
	}
	var mps []string
	for _, fields := range lines {
		if len(fields) < 5 {
			continue
		}
		mp := unescapeMount(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			mps = append(mps, mp)
		}
	}
	sort.Slice(mps, func(i, j int) bool { return len(mps[i]) > len(mps[j]) })
	return mps, nil
}

// unescapeMount decodes the octal escapes (\040 for space...) of mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// unmountUnder lazily unmounts every mount at or below dir.
func unmountUnder(dir string) error {
	var errs []error
	for attempt := 0; attempt < 5; attempt++ {
		mps, err := mountPoints(dir)
		if err != nil {
			return err
		}
		if len(mps) == 0 {
			return nil
		}
		errs = errs[:0]
		for _, mp := range mps {
			if err := syscall.Unmount(mp, syscall.MNT_DETACH); err != nil && !errors.Is(err, syscall.EINVAL) && !errors.Is(err, syscall.ENOENT) {
				errs = append(errs, fmt.Errorf("unmounting %s: %w", mp, err))
			}
		}
	}
	if mps, err := mountPoints(dir); err == nil && len(mps) > 0 {
		errs = append(errs, fmt.Errorf("still mounted under %s: %s", dir, strings.Join(mps, ", ")))
	}
	return errors.Join(errs...)
}

// cgroupMounts returns the mount points of the cgroup v1 hierarchies and of
// the cgroup v2 hierarchy (unified, in hybrid mode).
func cgroupMounts() ([]string, error) {
	lines, err := mountinfo()
	if err != nil {
		return nil, err
	}
	var mps []string
	for _, fields := range lines {
		for i, f := range fields {
			if f == "-" && i+1 < len(fields) && (fields[i+1] == "cgroup" || fields[i+1] == "cgroup2") && fields[3] == "/" {
				mps = append(mps, unescapeMount(fields[4]))
			}
		}
	}
	return mps, nil
}

// isCgroupV1 reports whether the host runs cgroup v1 (or hybrid) rather than
// the unified cgroup v2 hierarchy.
func isCgroupV1() bool {
	var st syscall.Statfs_t
	if err := syscall.Statfs("/sys/fs/cgroup", &st); err != nil {
		return false
	}
	const cgroup2Magic = 0x63677270
	return st.Type != cgroup2Magic
}

// createCgroups creates the cgroup root (e.g. "/gpulink-0123abcd") in every
// hierarchy so that the kubelet can use it as its --cgroup-root. cpuset
// cgroups get their parent's CPUs and memory nodes.
func createCgroups(root string) error {
	mps, err := cgroupMounts()
	if err != nil {
		return fmt.Errorf("creating cgroup %s: %w", root, err)
	}
	for _, mp := range mps {
		d := filepath.Join(mp, root)
		if err := os.MkdirAll(d, 0o755); err != nil {
			return fmt.Errorf("creating cgroup %s: %w", d, err)
		}
		for _, f := range []string{"cpuset.cpus", "cpuset.mems"} {
			parent, err := os.ReadFile(filepath.Join(mp, f))
			if err != nil {
				continue // not the cpuset hierarchy
			}
			if err := os.WriteFile(filepath.Join(d, f), parent, 0o644); err != nil {
				return fmt.Errorf("initialising %s/%s: %w", d, f, err)
			}
		}
	}
	return nil
}

// removeCgroups kills the processes left in the cgroup root's subtree and
// removes it from every hierarchy, deepest cgroups first.
func removeCgroups(root string) error {
	mps, err := cgroupMounts()
	if err != nil {
		return fmt.Errorf("removing cgroup %s: %w", root, err)
	}
	var errs []error
	for _, mp := range mps {
		top := filepath.Join(mp, root)
		if _, err := os.Stat(top); err != nil {
			continue
		}
		var dirs []string
		_ = filepath.WalkDir(top, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, p)
			}
			return nil
		})
		sort.Slice(dirs, func(i, j int) bool { return len(dirs[i]) > len(dirs[j]) })
		for _, d := range dirs {
			var err error
			for attempt := 0; attempt < 50; attempt++ {
				killCgroupProcs(d)
				if err = syscall.Rmdir(d); err == nil || errors.Is(err, syscall.ENOENT) {
					err = nil
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				errs = append(errs, fmt.Errorf("removing cgroup %s: %w", d, err))
			}
		}
	}
	return errors.Join(errs...)
}

func killCgroupProcs(dir string) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if err != nil {
		return
	}
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid != os.Getpid() {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}
