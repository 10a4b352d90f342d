// Package mpstest has test doubles of the MPS package's seams, shared by
// the MPS package's own tests and the kubelet plugin's.
package mpstest

import (
	"context"
	"sync"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
)

// FakeDaemon is an mps.Daemon that records starts and stops per claim,
// and the share (GPUs and limits) each was started with.
type FakeDaemon struct {
	mu      sync.Mutex
	Running map[string]bool
	Starts  map[string]int
	Stops   map[string]int
	Shares  map[string]mps.Share
	// StartErr, when set, fails every Start.
	StartErr error
}

// NewFakeDaemon returns a FakeDaemon with nothing started.
func NewFakeDaemon() *FakeDaemon {
	return &FakeDaemon{Running: map[string]bool{}, Starts: map[string]int{}, Stops: map[string]int{}, Shares: map[string]mps.Share{}}
}

// Start implements mps.Daemon.
func (f *FakeDaemon) Start(_ context.Context, share mps.Share, _ mps.Dirs) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.StartErr != nil {
		return f.StartErr
	}
	f.Starts[share.ID()]++
	f.Running[share.ID()] = true
	f.Shares[share.ID()] = share
	return nil
}

// Stop implements mps.Daemon.
func (f *FakeDaemon) Stop(_ context.Context, share mps.Share, _ mps.Dirs) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.Stops[share.ID()]++
	delete(f.Running, share.ID())
	return nil
}

// IsRunning tells whether the claim's daemon is started.
func (f *FakeDaemon) IsRunning(id string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Running[id]
}

// StartCount is how often the claim's daemon was started.
func (f *FakeDaemon) StartCount(id string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.Starts[id]
}
