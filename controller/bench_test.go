package controller

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/gpulink/gpulink/driver/allocate"
)

// runBenchController runs a controller (binpack, one worker) over a fake
// API server holding objs until its caches hold the nodes' inventories;
// stop, called when the benchmark ends, stops it.
func runBenchController(b *testing.B, objs []runtime.Object, nodes int) (c *Controller, ctx context.Context, stop func()) {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c, err := New(Config{Client: fake.NewClientset(objs...), Recorder: &testRecorder{}, Workers: 1,
		Policy: allocate.Policy{Node: allocate.Binpack, GPU: allocate.Binpack}})
	if err != nil {
		cancel()
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	stop = func() { cancel(); <-done }
	b.Cleanup(stop)
	for deadline := time.Now().Add(2 * time.Minute); !c.Ready() || len(c.inv.All()) < nodes; {
		if time.Now().After(deadline) {
			b.Fatal("caches not synced")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return c, ctx, stop
}
