//go:build integration

package controller_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"
)

// envInt reads a positive integer from the environment, def otherwise.
func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// churnSeed returns the seed of a churn test's random draws: the pods'
// kinds, sizes and lifetimes, the injected faults, the restarts.
// GPULINK_CHURN_SEED sets it; otherwise it is drawn from the clock. It is
// logged, and repeated when the test fails, so that a failing run's
// workload can be replayed. The interleaving with kube-scheduler and the
// API server still depends on timing: a replay runs the same workload,
// not necessarily the same race.
func churnSeed(t *testing.T) uint64 {
	t.Helper()
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("GPULINK_CHURN_SEED"); v != "" {
		s, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("GPULINK_CHURN_SEED=%q: %v", v, err)
		}
		seed = s
	}
	t.Logf("seed %d (GPULINK_CHURN_SEED=%d replays this run's draws)", seed, seed)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("failed with GPULINK_CHURN_SEED=%d", seed)
		}
	})
	return seed
}

// burnCPU keeps n goroutines spinning until the returned stop is called or
// limit passes, whichever comes first: load that slows the controller,
// the API server, etcd and kube-scheduler (which share the machine's CPUs)
// and widens the windows in which their actions interleave, as a busy CI
// machine does.
func burnCPU(n int, limit time.Duration) (stop func()) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			x := uint64(1)
			for ctx.Err() == nil {
				for range 1 << 16 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			_ = x
		})
	}
	return func() {
		cancel()
		wg.Wait()
	}
}
