package mps

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver"
)

// GPU identifies a GPU an MPS control daemon serves.
type GPU struct {
	Index int
	// UUID is the GPU's UUID; empty when discovery does not know it
	// (topology-file and mock discovery), in which case the index is used.
	UUID string
}

// ID names the GPU: the UUID, or the device name when the UUID is unknown.
func (g GPU) ID() string {
	if g.UUID != "" {
		return g.UUID
	}
	return driver.DeviceName(g.Index)
}

// visibleDevice is what CUDA_VISIBLE_DEVICES names the GPU by.
func (g GPU) visibleDevice() string {
	if g.UUID != "" {
		return g.UUID
	}
	return fmt.Sprint(g.Index)
}

// Device is one GPU of an MPS share with the claim's pinned memory
// limit on it (the sum of the claim's MPS results on that GPU).
type Device struct {
	GPU
	MemoryBytes int64
}

// Share is one claim's part of an MPS control daemon: the MPS shares of
// the claim, on one GPU or several, with the claim's limits.
//
// Isolated (Group empty, the default): the daemon is the claim's own,
// because MPS applies limits per server and a daemon's defaults to every
// server it spawns; only a daemon of its own gives a claim limits that its
// containers cannot raise (see doc.go, "MPS daemons").
//
// Concurrent (Group set): the daemon is the group's on the share's one
// GPU, and serves every claim of the group there, so their clients run in
// one server at the same time instead of time-sliced. It sets no limits of
// its own: each client's limits come from its environment (the claim's CDI
// edits), which the group's containers could raise, so the group shares
// the GPU as one tenant.
type Share struct {
	Claim types.UID
	// Group is the sharing group of a Concurrent share (the claim's
	// namespace); empty for an Isolated share. A Concurrent share has
	// exactly one GPU.
	Group string
	// GPUs are in the order the claim's containers number them (claimGPUs:
	// PCI bus order). The daemon gets them in that order in
	// CUDA_VISIBLE_DEVICES, and MPS renumbers a daemon's visible devices
	// from 0 in list order for its server and clients, so GPUs[i] is
	// device ordinal i for the daemon's limits and for the containers.
	GPUs []Device
	// Cores is the active thread percentage, 1..100. MPS has one per
	// server, for all its GPUs, so a claim's MPS shares must ask the same
	// percentage on each GPU (checkClaimShape).
	Cores int64
}

// gpuIDs names the share's GPUs for logs and errors.
func (s Share) gpuIDs() string {
	ids := make([]string, len(s.GPUs))
	for i, g := range s.GPUs {
		ids[i] = g.ID()
	}
	return strings.Join(ids, ",")
}

// memoryBytes lists the per-GPU limits, in GPUs order, for logs.
func (s Share) memoryBytes() []int64 {
	m := make([]int64, len(s.GPUs))
	for i, g := range s.GPUs {
		m[i] = g.MemoryBytes
	}
	return m
}

// visibleDevices is the daemon's CUDA_VISIBLE_DEVICES.
func (s Share) visibleDevices() string {
	v := make([]string, len(s.GPUs))
	for i, g := range s.GPUs {
		v[i] = g.visibleDevice()
	}
	return strings.Join(v, ",")
}

// ID is the name of the share's MPS directory and daemon: the claim UID
// of an Isolated share, GroupID of a Concurrent one.
func (s Share) ID() string {
	if s.Group != "" && len(s.GPUs) == 1 {
		return GroupID(s.Group, s.GPUs[0].GPU)
	}
	return string(s.Claim)
}

// Concurrent tells whether the share's daemon is its group's (Group set).
func (s Share) Concurrent() bool { return s.Group != "" }

// GroupID names the daemon of a sharing group on a GPU:
// <group>-gpu-<UUID without its GPU- prefix>, in lower case, e.g.
// team-a-gpu-8f6e1a2b-0c3d-4e5f-8a9b-0c1d2e3f4a5b; where discovery knows no
// UUID, <group>-gpu-<index>. The UUID makes the daemon pod's name unique in
// the cluster (the pods of every node share one namespace), and the chart's
// admission policy reads the group and the GPU back from it. A claim UID
// never takes this form ("g", "p", "u" are not hexadecimal), and a group is
// a namespace name, a DNS label, so the name stays one too.
func GroupID(group string, gpu GPU) string {
	return group + "-" + strings.ToLower(gpu.ID())
}

// Dirs are the host directories of one claim's MPS control daemon.
type Dirs struct {
	// Base holds the three below; removing it removes everything.
	Base string
	Pipe string
	Log  string
	// Shm is the /dev/shm shared by the daemon's server and the claim's
	// containers (MPS passes memory between them through it).
	Shm string
}

// create makes the directories. /dev/shm must be writable by the claim's
// containers whatever their UID, hence sticky and world-writable like the
// real one; it is reachable only by the containers it is mounted into.
func (d Dirs) create() error {
	for _, dir := range []string{d.Pipe, d.Log, d.Shm} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return fmt.Errorf("creating MPS directory: %w", err)
		}
	}
	if err := os.Chmod(d.Shm, 0o777|os.ModeSticky); err != nil {
		return fmt.Errorf("making MPS shm directory world-writable: %w", err)
	}
	return nil
}

// remove deletes the directories; missing ones are fine.
func (d Dirs) remove() error {
	if d.Base == "" {
		return nil
	}
	if err := os.RemoveAll(d.Base); err != nil {
		return fmt.Errorf("removing MPS directory: %w", err)
	}
	return nil
}

// Manager hands out references to MPS control daemons: the first
// reference starts a daemon, releasing the last stops it. A claim with
// several MPS results on its GPU holds one reference per result. Isolated
// shares reference their claim's daemon, Concurrent ones their group's
// daemon on their GPU (Share.ID), so the references of every claim of a
// group on a GPU add up and the daemon stops with the group's last share.
type Manager interface {
	EnsureDaemon(ctx context.Context, share Share) error
	ReleaseDaemon(ctx context.Context, share Share) error
	// Dirs returns where the share's daemon keeps its pipes, logs and shm.
	Dirs(share Share) Dirs
	// RemoveOrphans stops the daemons and removes the directories that are
	// not in keep (Share.ID: claim UIDs and group daemons) and hold no
	// reference: what a reboot, a lost checkpoint or a failed stop left
	// behind. It returns the IDs it cleaned up.
	RemoveOrphans(ctx context.Context, keep map[string]bool) ([]string, error)
	// ReassertLimits sets every running Isolated daemon's limits again
	// (see LimitEnforcer) and returns the claim UIDs it could not reach.
	// Concurrent daemons have no limits of their own.
	ReassertLimits(ctx context.Context) ([]string, error)
	// RetryKept starts again (adopting a running one) every daemon whose
	// start failed without a definite answer and was kept with its
	// reference (ErrDaemonKept), and returns the IDs still not up.
	RetryKept(ctx context.Context) ([]string, error)
}

// LimitEnforcer is implemented by daemons whose limits a container of the
// claim could change: the claim's pipe directory is mounted into its
// containers (MPS clients need it), and MPS takes control commands from
// anyone who can write to it, so a container can send
// set_default_active_thread_percentage 100 to its own daemon. MPS offers
// no way to refuse that, so the plugin sets the limits again periodically
// (README.md, "What MPS guarantees").
type LimitEnforcer interface {
	ReassertLimits(ctx context.Context, share Share, dirs Dirs) error
}

// OrphanLister is implemented by daemons that outlive the plugin process
// (PodDaemon): it lists the IDs (Share.ID) of the daemons that run on this
// node, so that RemoveOrphans finds daemons whose directories are gone too.
type OrphanLister interface {
	ListDaemons(ctx context.Context) ([]string, error)
}

// Daemon starts and stops one claim's control daemon; Manager does
// the reference counting on top. Start must succeed when the daemon is
// already running (started before a plugin restart: it is adopted), must
// apply the share's limits on the daemon every time, and must leave
// nothing behind when it fails. Stop removes the daemon and its dirs.
type Daemon interface {
	Start(ctx context.Context, share Share, dirs Dirs) error
	Stop(ctx context.Context, share Share, dirs Dirs) error
}

// ErrDaemonKept marks a Start that failed on a daemon that was already
// running (adopted after a plugin restart), or where the API server gave
// no definite answer whether one runs: it may serve running containers,
// so it is not stopped, and Manager keeps the reference, so that the
// claim's unprepare stops it, and retries the start (RetryKept).
var ErrDaemonKept = errors.New("the daemon was already running and is kept for the claim's running containers")

type mpsManager struct {
	root   string
	daemon Daemon

	mu   sync.Mutex
	refs map[string]int
	// shares are the referenced shares, for ReassertLimits.
	shares map[string]Share
	// kept are the referenced daemons whose last start failed with
	// ErrDaemonKept, for RetryKept.
	kept map[string]bool
}

// NewManager counts references to the daemons under root
// (<root>/<claim UID>/{pipe,log,shm}) and starts and stops them with
// daemon.
func NewManager(root string, daemon Daemon) Manager {
	return &mpsManager{root: root, daemon: daemon, refs: map[string]int{}, shares: map[string]Share{}, kept: map[string]bool{}}
}

func (m *mpsManager) Dirs(share Share) Dirs {
	base := filepath.Join(m.root, share.ID())
	return Dirs{
		Base: base,
		Pipe: filepath.Join(base, "pipe"),
		Log:  filepath.Join(base, "log"),
		Shm:  filepath.Join(base, "shm"),
	}
}

func (m *mpsManager) EnsureDaemon(ctx context.Context, share Share) error {
	if share.Claim == "" {
		return fmt.Errorf("MPS share on GPU %s: no claim UID", share.gpuIDs())
	}
	if len(share.GPUs) == 0 {
		return fmt.Errorf("MPS share of claim %s: no GPU", share.ID())
	}
	if share.Concurrent() && len(share.GPUs) != 1 {
		// One daemon per group and GPU, and a client reaches one daemon.
		return fmt.Errorf("Concurrent MPS share of claim %s on GPUs %s: a Concurrent share has one GPU", share.Claim, share.gpuIDs())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	id := share.ID()
	if m.refs[id] == 0 {
		if err := m.daemon.Start(ctx, share, m.Dirs(share)); err != nil {
			if errors.Is(err, ErrDaemonKept) {
				m.refs[id]++
				m.shares[id] = share
				m.kept[id] = true
			}
			return fmt.Errorf("starting MPS control daemon of claim %s on GPU %s: %w", id, share.gpuIDs(), err)
		}
		if share.Concurrent() {
			klog.FromContext(ctx).Info("MPS control daemon of a sharing group up", "daemon", id, "group", share.Group, "gpus", share.gpuIDs(), "firstClaimUID", share.Claim)
		} else {
			klog.FromContext(ctx).Info("MPS control daemon up", "claimUID", id, "gpus", share.gpuIDs(), "memoryBytes", share.memoryBytes(), "cores", share.Cores)
		}
	}
	m.refs[id]++
	m.shares[id] = share
	return nil
}

func (m *mpsManager) ReassertLimits(ctx context.Context) ([]string, error) {
	enforcer, ok := m.daemon.(LimitEnforcer)
	if !ok {
		return nil, nil
	}
	// Not under the lock: the commands run processes, and prepares must
	// not wait for them. A daemon stopped meanwhile is not reported.
	// A group's daemon has no limits of its own to set again: its
	// clients' limits are in their environment.
	m.mu.Lock()
	shares := make([]Share, 0, len(m.shares))
	for id, s := range m.shares {
		// A kept daemon did not answer: RetryKept takes it.
		if !s.Concurrent() && !m.kept[id] {
			shares = append(shares, s)
		}
	}
	m.mu.Unlock()
	var failed []string
	var errs []error
	for _, s := range shares {
		err := enforcer.ReassertLimits(ctx, s, m.Dirs(s))
		if err == nil {
			continue
		}
		m.mu.Lock()
		live := m.refs[s.ID()] > 0
		m.mu.Unlock()
		if live {
			failed = append(failed, s.ID())
			errs = append(errs, fmt.Errorf("claim %s: %w", s.ID(), err))
		}
	}
	slices.Sort(failed)
	return failed, errors.Join(errs...)
}

func (m *mpsManager) RetryKept(ctx context.Context) ([]string, error) {
	// Not under the lock: a start may wait for a daemon up to its start
	// timeout, and prepares must not wait for that.
	m.mu.Lock()
	kept := make([]Share, 0, len(m.kept))
	for id := range m.kept {
		kept = append(kept, m.shares[id])
	}
	m.mu.Unlock()
	var failed []string
	var errs []error
	for _, share := range kept {
		id := share.ID()
		// Start adopts the pod if it runs and starts one if it is gone
		// (the reference says a prepared claim needs it); it deletes
		// nothing it could not read.
		err := m.daemon.Start(ctx, share, m.Dirs(share))
		m.mu.Lock()
		switch {
		case m.refs[id] == 0:
			// Released meanwhile (the claim's unprepare, whose stop may
			// have run before this start): nobody needs the daemon.
			delete(m.kept, id)
			if err == nil {
				err = m.daemon.Stop(ctx, share, m.Dirs(share))
			}
		case err == nil:
			delete(m.kept, id)
			klog.FromContext(ctx).Info("MPS control daemon up after an earlier start failed without a definite answer", "daemon", id, "group", share.Group, "gpus", share.gpuIDs())
		}
		m.mu.Unlock()
		if err != nil {
			failed = append(failed, id)
			errs = append(errs, fmt.Errorf("MPS control daemon %s: %w", id, err))
		}
	}
	slices.Sort(failed)
	return failed, errors.Join(errs...)
}

func (m *mpsManager) RemoveOrphans(ctx context.Context, keep map[string]bool) ([]string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	ids := map[string]bool{}
	entries, err := os.ReadDir(m.root)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("listing MPS directories in %s: %w", m.root, err)
	}
	for _, e := range entries {
		if e.IsDir() {
			ids[e.Name()] = true
		}
	}
	if l, ok := m.daemon.(OrphanLister); ok {
		running, err := l.ListDaemons(ctx)
		if err != nil {
			return nil, err
		}
		for _, id := range running {
			ids[id] = true
		}
	}
	var removed []string
	var errs []error
	for id := range ids {
		if keep[id] || m.refs[id] > 0 {
			continue
		}
		// A share with only its claim set names the daemon and its
		// directories (its ID is the claim's, or the group daemon's ID
		// read back); Stop needs nothing else.
		share := Share{Claim: types.UID(id)}
		if err := m.daemon.Stop(ctx, share, m.Dirs(share)); err != nil {
			errs = append(errs, fmt.Errorf("removing orphaned MPS daemon of claim %s: %w", id, err))
			continue
		}
		removed = append(removed, id)
	}
	slices.Sort(removed)
	return removed, errors.Join(errs...)
}

// Daemons is the number of control daemons running (referenced).
func (m *mpsManager) Daemons() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.refs)
}

func (m *mpsManager) ReleaseDaemon(ctx context.Context, share Share) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := share.ID()
	n := m.refs[id]
	if n == 0 {
		return fmt.Errorf("releasing MPS control daemon of claim %s: no reference held", id)
	}
	if n == 1 {
		if err := m.daemon.Stop(ctx, share, m.Dirs(share)); err != nil {
			// Keep the reference: the daemon may still run and a retried
			// unprepare must try to stop it again.
			return fmt.Errorf("stopping MPS control daemon of claim %s: %w", id, err)
		}
		delete(m.refs, id)
		delete(m.shares, id)
		delete(m.kept, id)
		klog.FromContext(ctx).Info("MPS control daemon stopped", "daemon", id, "group", share.Group, "gpus", share.gpuIDs())
		return nil
	}
	m.refs[id] = n - 1
	return nil
}

// AdjustRefs changes the reference count of a share's daemon without
// starting or stopping it: another instance of the plugin did, sharing
// the plugin directory during a rolling update (kubeletplugin/rolling.go).
func (m *mpsManager) AdjustRefs(share Share, delta int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	id := share.ID()
	n := m.refs[id] + delta
	if n <= 0 {
		delete(m.refs, id)
		delete(m.shares, id)
		delete(m.kept, id)
		return
	}
	m.refs[id] = n
	m.shares[id] = share
}

// Refs is the number of references the daemon with this ID (Share.ID)
// holds: for a group's daemon, those of every claim of the group on its GPU.
func (m *mpsManager) Refs(id string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.refs[id]
}
