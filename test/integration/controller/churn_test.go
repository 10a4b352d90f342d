//go:build integration

package controller_test

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// TestChurnWithRestarts creates and deletes pods of random sizes and
// shares at random across four nodes while the controller is stopped and
// restarted at random moments (cancelling whatever API call is in flight).
// An invariant checker runs over all claims throughout: no device is given
// out twice, shares never exceed a GPU, allocations sit on their node.
// Every bound pod must be on the node its claims were allocated on. After
// the last pod is gone no claim may remain (nothing leaks).
//
// GPULINK_CHURN_PODS overrides the number of pods (default 500);
// GPULINK_CHURN_SEED replays a run's workload and restart draws (churnSeed).
func TestChurnWithRestarts(t *testing.T) {
	total := envInt("GPULINK_CHURN_PODS", 500)
	seed := churnSeed(t)
	rng := rand.New(rand.NewPCG(seed, 0))
	restartRng := rand.New(rand.NewPCG(seed, 1))
	const maxLive = 40
	e := setup(t, map[string]string{
		"churn-v100-1": "v100-sxm2-8-aliyun-sccgn6.txt",
		"churn-v100-2": "v100-sxm2-8-aliyun-sccgn6.txt",
		"churn-p40":    "p40-pcie-7.txt",
		"churn-a100":   "dgx-a100.txt",
	})
	templates := map[string]resourceapi.DeviceClaim{
		"one":         {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}},
		"two":         {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}},
		"four":        {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}},
		"eight":       {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 8)}},
		"four-nvlink": {Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}, Config: []resourceapi.DeviceClaimConfiguration{controllertest.RequiredNVLinkConfig()}},
		"share-s":     {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "1Gi", "10")}},
		"share-m":     {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "4Gi", "25")}},
		"share-l":     {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "12Gi", "50")}},
		"share-dflt":  {Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "", "")}},
	}
	for n, spec := range templates {
		e.template(n, spec)
	}
	// Small requests are more common than large ones.
	weights := map[string]int{"one": 4, "two": 3, "four": 1, "eight": 1, "four-nvlink": 1, "share-s": 3, "share-m": 3, "share-l": 2, "share-dflt": 2}
	var names []string
	// In a fixed order, so that a seed picks the same templates.
	for _, n := range slices.Sorted(maps.Keys(weights)) {
		for range weights[n] {
			names = append(names, n)
		}
	}

	// The controller, restarted at random moments.
	var mu sync.Mutex
	cur := e.startController(4)
	stopRestarts := make(chan struct{})
	var restarts atomic.Int32
	var restarter sync.WaitGroup
	restarter.Go(func() {
		for {
			select {
			case <-stopRestarts:
				return
			case <-time.After(time.Duration(1500+restartRng.IntN(4500)) * time.Millisecond):
			}
			mu.Lock()
			cur.stop()
			time.Sleep(time.Duration(restartRng.IntN(500)) * time.Millisecond)
			cur = e.startController(4)
			mu.Unlock()
			restarts.Add(1)
		}
	})

	// The invariant checker.
	var violation atomic.Value
	stopCheck := make(chan struct{})
	var checker sync.WaitGroup
	var checks atomic.Int32
	checker.Go(func() {
		for {
			select {
			case <-stopCheck:
				return
			case <-time.After(250 * time.Millisecond):
			}
			if err := e.checkInvariants(); err != nil && violation.Load() == nil {
				violation.Store(err.Error())
			}
			checks.Add(1)
		}
	})

	cp := newChurnPods()
	var created int
	start := time.Now()
	for created < total || len(cp.live) > 0 {
		now := time.Now()
		cp.sweep(t, e, now)
		for created < total && len(cp.live) < maxLive {
			name := fmt.Sprintf("p%04d", created)
			tpl := names[rng.IntN(len(names))]
			e.createPod(e.newPod(name, rng.IntN(5) != 0, tpl))
			cp.live[name] = &livePod{created: now,
				boundLife: time.Duration(rng.IntN(1500)) * time.Millisecond,
				maxWait:   time.Duration(2000+rng.IntN(8000)) * time.Millisecond}
			created++
		}
		time.Sleep(100 * time.Millisecond)
	}
	churn := time.Since(start)

	close(stopRestarts)
	restarter.Wait()
	// Nothing may leak: every claim is released and deleted once its pod is gone.
	mu.Lock()
	e.poll("all claims released and deleted", 3*time.Minute, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
		return err == nil && len(l.Items) == 0
	})
	cur.stop()
	mu.Unlock()
	close(stopCheck)
	checker.Wait()
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
	if v := violation.Load(); v != nil {
		t.Errorf("invariant violated during churn: %s", v)
	}
	t.Logf("churn: %d pods (%d bound, %d deleted while pending) in %s, %d controller restarts, %d invariant checks",
		created, cp.bound, cp.deletedPending, churn.Round(time.Millisecond), restarts.Load(), checks.Load())
	if cp.bound == 0 {
		t.Error("no pod was ever bound")
	}
}
