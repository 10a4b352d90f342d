package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// setLimits makes the share's limits the defaults of every server the
// daemon spawns. The daemon serves only this claim, so these are the
// claim's limits; a client's CUDA_MPS_* environment can lower them, not
// raise them. The daemon sees the claim's GPUs (CUDA_VISIBLE_DEVICES) as
// devices 0..n-1 in share.GPUs order, so each pinned memory limit goes to
// that ordinal; the active thread percentage is one per server.
// Sent on adoption too: it is idempotent, and a daemon restarted by hand
// would otherwise run without limits.
func (d *PodDaemon) setLimits(ctx context.Context, share Share, dirs Dirs) error {
	if share.Concurrent() {
		// The group's daemon serves claims of different sizes: each
		// client's limits are in its own environment (CDI edits).
		return nil
	}
	if len(share.GPUs) == 0 {
		return fmt.Errorf("MPS share of claim %s: no GPU", share.ID())
	}
	if share.Cores < 1 || share.Cores > maxThreadPercentage {
		return fmt.Errorf("MPS share of claim %s: active thread percentage %d is not within 1..%d", share.ID(), share.Cores, maxThreadPercentage)
	}
	cmds := []string{"set_default_active_thread_percentage " + strconv.FormatInt(share.Cores, 10)}
	for i, g := range share.GPUs {
		mib := g.MemoryBytes / mib
		if mib < 1 {
			return fmt.Errorf("MPS share of claim %s on GPU %s: pinned memory limit %d bytes is less than 1Mi", share.ID(), g.ID(), g.MemoryBytes)
		}
		cmds = append(cmds, fmt.Sprintf("set_default_device_pinned_mem_limit %d %dM", i, mib))
	}
	for _, cmd := range cmds {
		if _, err := d.control(ctx, share, dirs, cmd); err != nil {
			return fmt.Errorf("setting the claim's limit on its MPS daemon: %w", err)
		}
	}
	return nil
}

// ReassertLimits sets the claim's limits on its daemon again: the defaults
// for servers it spawns later, and the active thread percentage of every
// server running now (set_active_thread_percentage <PID>), in case a
// container of the claim changed them through the pipe directory it
// shares with the daemon. Pinned memory limits reach a running server's
// clients when they connect; a client connected under raised limits keeps
// them until it exits, which the README says ("What MPS guarantees").
func (d *PodDaemon) ReassertLimits(ctx context.Context, share Share, dirs Dirs) error {
	if share.Concurrent() {
		return nil // no limits of its own (setLimits)
	}
	if err := d.setLimits(ctx, share, dirs); err != nil {
		return err
	}
	out, err := d.control(ctx, share, dirs, "get_server_list")
	if err != nil {
		return fmt.Errorf("listing the MPS servers of claim %s: %w", share.ID(), err)
	}
	for _, pid := range strings.Fields(out) {
		if _, err := strconv.Atoi(pid); err != nil {
			continue // not a PID: a message of the control client
		}
		if _, err := d.control(ctx, share, dirs, "set_active_thread_percentage "+pid+" "+strconv.FormatInt(share.Cores, 10)); err != nil {
			return fmt.Errorf("setting the claim's active thread percentage on MPS server %s: %w", pid, err)
		}
	}
	return nil
}

// control sends one command to the share's daemon. The control client
// runs as the plugin's user (root) and opens what it finds in the pipe
// directory, which the claim's containers can write (they are MPS
// clients): a symlink planted there would make it open a file of the
// plugin's choosing, so it does not run while the pipe or log directory
// holds one (checkNoSymlinks).
func (d *PodDaemon) control(ctx context.Context, share Share, dirs Dirs, cmd string) (string, error) {
	for _, dir := range []string{dirs.Pipe, dirs.Log} {
		if err := checkNoSymlinks(dir); err != nil {
			return "", fmt.Errorf("not running %s for %q: %w", ControlBinary, cmd, err)
		}
	}
	bin := d.controlBin(d.cfg.DriverRootMount)
	out, err := d.cfg.Run(ctx, bin, nil, d.env(d.cfg.DriverRootMount, share, dirs), cmd+"\n")
	text := strings.TrimSpace(string(out))
	if err != nil {
		return text, fmt.Errorf("echo %s | %s: %w (output: %q)", cmd, bin, err, text)
	}
	// The control client exits 0 on some refusals and says so.
	if l := strings.ToLower(text); strings.Contains(l, "error") || strings.Contains(l, "invalid") || strings.Contains(l, "cannot find") {
		return text, fmt.Errorf("echo %s | %s: %q", cmd, bin, text)
	}
	return text, nil
}

// checkNoSymlinks refuses a directory that is a symlink or holds one. The
// MPS daemon makes pipes, sockets and lock files there, never symlinks,
// so one is a container's doing; hard links cannot reach outside the
// directory's mount (link(2) fails across mounts).
func checkNoSymlinks(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil // nothing to follow; the client finds no daemon
	}
	if err != nil {
		return fmt.Errorf("MPS directory %s: %w", dir, err)
	}
	if !fi.IsDir() {
		return fmt.Errorf("MPS directory %s is not a directory (%s)", dir, fi.Mode().Type())
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("MPS directory %s: %w", dir, err)
	}
	for _, e := range entries {
		if e.Type()&os.ModeSymlink != 0 {
			return fmt.Errorf("MPS directory %s holds a symlink %q, which the MPS daemon never makes (planted by a container of the claim?): the control client, run as root, would follow it", dir, e.Name())
		}
	}
	return nil
}

// ListDaemons lists the IDs (Share.ID) of this node's daemon pods, by
// label: claim UIDs of Isolated daemons, group daemon IDs of Concurrent ones.
func (d *PodDaemon) ListDaemons(ctx context.Context) ([]string, error) {
	sel := mpsComponentLabel + "=" + mpsComponentValue + "," + mpsNodeLabel + "=" + d.cfg.NodeName
	list, err := d.cfg.Pods.Pods(d.cfg.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, fmt.Errorf("listing this node's MPS daemon pods in %s (%s): %w", d.cfg.Namespace, sel, err)
	}
	var ids []string
	for _, p := range list.Items {
		// Pods named otherwise are not ours to delete (the admission
		// policy would refuse it anyway).
		if p.Spec.NodeName != d.cfg.NodeName {
			continue
		}
		if id := p.Labels[mpsClaimLabel]; id != "" && p.Name == mpsPodPrefix+id {
			ids = append(ids, id)
			continue
		}
		// A group's daemon: its name starts with the group's.
		if g := p.Labels[mpsGroupLabel]; g != "" && strings.HasPrefix(p.Name, mpsPodPrefix+g+"-gpu-") {
			ids = append(ids, strings.TrimPrefix(p.Name, mpsPodPrefix))
		}
	}
	return ids, nil
}
