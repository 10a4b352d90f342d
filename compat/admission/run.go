package admission

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"

	"github.com/gpulink/gpulink/compat"
)

// Options configure the translation webhook and its leader-side work.
type Options struct {
	Address string
	// ReusePort: see ServeTLS.
	ReusePort bool
	CertDir   string
	Config    compat.Config
	Packing   compat.Packing
	Grace     time.Duration
	Metrics   prometheus.Registerer
	Recorder  events.EventRecorder
}

// Serve runs the webhook until ctx ends. Every replica serves it (the
// webhook Service has no notion of a leader); only decisions and the
// leader-side work need the lease.
func Serve(ctx context.Context, client kubernetes.Interface, o Options) error {
	factory := informers.NewSharedInformerFactory(client, 0)
	slices := factory.Resource().V1().ResourceSlices().Informer()
	inv, err := NewInventory(slices)
	if err != nil {
		return fmt.Errorf("webhook inventory: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	// Serve even before the slices are synced: an empty inventory only
	// puts off the checks that need it (the controller reports those).
	wh := &Webhook{
		Translator: &compat.Translator{Config: o.Config, Inventory: inv, Packing: o.Packing},
		Templates:  &Templates{Client: client, Grace: o.Grace},
		Metrics:    NewMetrics(o.Metrics),
	}
	return ServeTLS(ctx, o.Address, o.CertDir, o.ReusePort, wh)
}

// Lead runs the leader's part until ctx ends: the Normal event on every
// translated pod and the garbage collection of unused templates.
func Lead(ctx context.Context, client kubernetes.Interface, o Options) error {
	factory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = compat.LabelManaged + "=true"
	}))
	pods := factory.Core().V1().Pods().Informer()
	if _, err := NewAnnouncer(pods, o.Recorder); err != nil {
		return fmt.Errorf("translated pod events: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced) {
		return nil
	}
	period := max(o.Grace/2, time.Second)
	(&Collector{Client: client, Grace: o.Grace}).Run(ctx, period)
	return nil
}
