package admission

import (
	"context"
	"fmt"
	"sync"
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
	// ReusePort: see TLSServer.
	ReusePort bool
	CertDir   string
	// Limits bound what the webhook's peers can hold (TLSServer).
	Limits   Limits
	Config   compat.Config
	Grace    time.Duration
	Metrics  prometheus.Registerer
	Recorder events.EventRecorder
}

// Serve runs the webhook until ctx ends. Every replica serves it (the
// webhook Service has no notion of a leader); only decisions and the
// leader-side work need the lease. It answers once the ResourceQuota cache
// has synced, so that no pod is translated past a quota it has not seen.
func Serve(ctx context.Context, client kubernetes.Interface, o Options) error {
	factory := informers.NewSharedInformerFactory(client, 0)
	slices := factory.Resource().V1().ResourceSlices().Informer()
	inv, err := NewInventory(slices)
	if err != nil {
		return fmt.Errorf("webhook inventory: %w", err)
	}
	quotas := factory.Core().V1().ResourceQuotas()
	quotaInformer := quotas.Informer()
	tr := &compat.Translator{Config: o.Config, Inventory: inv}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if err := waitSynced(ctx, "webhook", "ResourceQuota", quotaInformer.HasSynced); err != nil || ctx.Err() != nil {
		return err
	}
	// Serve even before the slices are synced: an empty inventory only
	// puts off the checks that need it (the controller reports those).
	metrics := NewMetrics(o.Metrics)
	wh := &Webhook{
		Translator:   tr,
		Quota:        NewQuotaGuard(quotas.Lister(), tr),
		Metrics:      metrics,
		MaxBodyBytes: o.Limits.withDefaults().MaxBodyBytes,
	}
	return ServeTLS(ctx, TLSServer{Address: o.Address, CertDir: o.CertDir, ReusePort: o.ReusePort, Limits: o.Limits, Metrics: metrics}, wh)
}

// Lead runs the leader's part until ctx ends: the templates translated
// pods name (TemplateMaker), the Normal event on every translated pod and
// the garbage collection of unused templates.
func Lead(ctx context.Context, client kubernetes.Interface, o Options) error {
	podFactory := informers.NewSharedInformerFactoryWithOptions(client, 0, informers.WithTweakListOptions(func(lo *metav1.ListOptions) {
		lo.LabelSelector = compat.LabelManaged + "=true"
	}))
	pods := podFactory.Core().V1().Pods().Informer()
	// Every template, not only labelled ones: one someone else made under
	// a translated name must be seen to be refused.
	factory := informers.NewSharedInformerFactory(client, 0)
	templates := factory.Resource().V1().ResourceClaimTemplates().Informer()
	quotas := factory.Core().V1().ResourceQuotas()
	quotaInformer := quotas.Informer()
	if _, err := NewAnnouncer(pods, o.Recorder); err != nil {
		return fmt.Errorf("translated pod events: %w", err)
	}
	tr := &compat.Translator{Config: o.Config}
	maker, err := NewTemplateMaker(TemplateMakerConfig{
		Client: client, Config: o.Config, Recorder: o.Recorder, Grace: o.Grace,
		Quota: NewQuotaGuard(quotas.Lister(), tr),
	}, pods, templates)
	if err != nil {
		return err
	}
	podFactory.Start(ctx.Done())
	factory.Start(ctx.Done())
	defer podFactory.Shutdown()
	defer factory.Shutdown()
	if err := waitSynced(ctx, "leader", "Pod, ResourceClaimTemplate and ResourceQuota", pods.HasSynced, templates.HasSynced, quotaInformer.HasSynced); err != nil || ctx.Err() != nil {
		return err
	}
	var wg sync.WaitGroup
	wg.Go(func() { maker.Run(ctx, 2) })
	period := max(o.Grace/2, time.Second)
	(&Collector{Client: client, Grace: o.Grace}).Run(ctx, period)
	wg.Wait()
	return nil
}

// syncTimeout bounds the wait for the informers' first list: a replica
// whose ClusterRole lacks a permission exits with a message saying so
// instead of never serving.
const syncTimeout = 2 * time.Minute

// waitSynced waits for the caches; it returns nil when ctx ends first.
func waitSynced(ctx context.Context, who, what string, synced ...cache.InformerSynced) error {
	wctx, cancel := context.WithTimeout(ctx, syncTimeout)
	defer cancel()
	if cache.WaitForCacheSync(wctx.Done(), synced...) || ctx.Err() != nil {
		return nil
	}
	return fmt.Errorf("%s: the %s caches did not sync within %s (does the controller's ClusterRole allow list and watch on them?)", who, what, syncTimeout)
}
