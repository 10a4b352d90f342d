package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	resourceinformers "k8s.io/client-go/informers/resource/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	schedulinglisters "k8s.io/client-go/listers/scheduling/v1beta1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/gangs"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/gang"
)

// fieldManager names the controller in managedFields.
const fieldManager = "gpulink-controller"

// podClaimIndex indexes pods by the namespace/name of the claims they use.
const podClaimIndex = "gpulink.dev/claims"

// Config configures a Controller.
type Config struct {
	Client kubernetes.Interface
	// Recorder records events; see NewRecorder.
	Recorder events.EventRecorder
	Metrics  *Metrics
	// Policy is the packing strategy at node and GPU level.
	Policy allocate.Policy
	// Workers is the number of pods processed in parallel. Decisions are
	// serialized; API writes of different pods overlap.
	Workers int
	// ResyncPeriod re-examines every object this often (0: never).
	ResyncPeriod time.Duration
	// UnschedulableGrace is how long kube-scheduler gets to bind a pod to
	// the node its claims were allocated on before the controller treats
	// the pod as unschedulable there and releases the allocation.
	UnschedulableGrace time.Duration
	// WaitingRetry retries waiting pods this often even if no event
	// suggests their chances changed.
	WaitingRetry time.Duration
	// DeviceTaintRules applies DeviceTaintRules (GA and on by default in
	// Kubernetes 1.37) to the devices, as kube-scheduler does: a device a
	// rule taints NoSchedule/NoExecute is only allocated to requests that
	// tolerate it. Turn off where the API is disabled.
	DeviceTaintRules bool
	// Mix configures the recent request-size mix each decision passes to
	// the allocator (it replaces Policy.Mix unless turned off).
	Mix planner.MixConfig
	// RankByStranding ranks nodes for pods with one device set by the GPU
	// a placement strands for the recent pods' shapes, counting each
	// node's CPU and memory left (stranding.go); off, nodes are ranked
	// by their GPUs alone.
	RankByStranding bool
	// PlanWorkers is how many goroutines a decision that plans node after
	// node (a pod with NICs beside its GPUs, a gang's counts) plans the
	// nodes with; 0: one per CPU the process may use
	// (planner.DefaultParallelism).
	PlanWorkers int
	// PlaceCPUPods places the gated pods that reference no resource claim
	// (the chart's opt-in gate.cpuPods gates them) on the node where they
	// strand the least GPU, as a preferred node affinity kube-scheduler
	// may still override (cpupods.go); off, their gate is lifted at once.
	PlaceCPUPods bool
	// SteerCPUPods is how pods without GPU claims are steered off GPU
	// nodes whose GPUs are still free, without gating them
	// (controller/steer, docs/cpu-pods.md): steer.ModeTaint keeps a
	// PreferNoSchedule taint on the GPU nodes with an idle GPU;
	// steer.ModeOff or "" keeps it on none and removes the taints left
	// from before once at start-up.
	SteerCPUPods string
	// SteerScarceNodes keeps a second PreferNoSchedule taint
	// (steer.ScarceTaintKey) on the GPU nodes all of whose GPUs are idle
	// and that a shape the demand mix weighs as scarce could run on, so
	// that kube-scheduler puts pods without GPU claims there last. It
	// needs SteerCPUPods steer.ModeTaint and RankByStranding; without
	// them, or off, the taints left from before are removed at start-up.
	SteerScarceNodes bool
	// SteerWritesPerSecond and SteerBurst bound the node patches of the
	// steering taint (0: steer's defaults).
	SteerWritesPerSecond float32
	SteerBurst           int
	// HoldNamespace is where the controller records the devices of
	// claims deleted while their pods still run (hold records, see
	// holds.go), so that kube-scheduler counts them too and a restarted
	// controller still does. Use a namespace only the controller and
	// cluster admins can write (the release namespace). Empty: such
	// devices are kept counted in this controller's memory only.
	HoldNamespace string
	// Gangs configures the placement of gangs: pods of one PodGroup or
	// gang label placed all or nothing, link-minimal across the
	// cluster's hierarchy (gang.go).
	Gangs GangConfig
	// SelectorAttempt bounds the time one attempt spends evaluating a
	// pod's claims' CEL selectors before its decision (selectors.go);
	// 0: 10 s.
	SelectorAttempt time.Duration
	// ReleaseGrace is how long the claim clean-up waits before it
	// releases an allocated claim no live pod in the cache references,
	// so that a pod the cache does not show yet keeps it (gc.go,
	// releaseWait). Default 2s.
	ReleaseGrace time.Duration
}

// Controller is the gpulink allocation controller.
type Controller struct {
	client   kubernetes.Interface
	factory  informers.SharedInformerFactory
	pods     corelisters.PodLister
	podIdx   cache.Indexer
	claimIdx cache.Indexer
	claims   resourcelisters.ResourceClaimLister
	classes  resourcelisters.DeviceClassLister
	nodes    corelisters.NodeLister
	synced   []cache.InformerSynced
	metrics  *Metrics
	explain  *explainer
	workers  int
	grace    time.Duration
	retry    time.Duration
	inv      *planner.Inventory
	ledger   *planner.Ledger
	fit      *planner.FitTracker
	ungating *ungating
	// claimVersions: claims released here that the informer has not
	// shown released yet (claimversions.go).
	claimVersions *claimVersions
	// boundElsewhere are the bound pods already reported with a claim
	// allocated on another node (boundelsewhere.go).
	boundElsewhere sets.Set[types.UID]
	// settles keeps claims released under a pod kube-scheduler holds
	// from being allocated again at once (settle.go).
	settles *releaseSettles
	// handledClaims: the claim versions the event handlers reacted to
	// (claimhandled.go).
	handledClaims *handledClaims
	// linkSeries: the kinds of node whose link series are exported
	// (metrics_links.go).
	linkSeries linkSeries
	sel        *planner.SelectorEvaluator
	// planner chooses nodes and devices over inv, ledger and filter.
	planner  *planner.Planner
	interp   *planner.Interpreter
	filter   *planner.NodeFilter
	podQueue workqueue.TypedRateLimitingInterface[string]
	gcQueue  workqueue.TypedRateLimitingInterface[string]
	// holdQueue has the UIDs of deleted claims kept counted for their
	// pods (holds.go).
	holdQueue workqueue.TypedRateLimitingInterface[types.UID]
	holdNS    string
	// stopTracker stops the ResourceSlice tracker that applies
	// DeviceTaintRules (a no-op without it).
	stopTracker func()

	// decideMu serializes decisions: planning reads the ledger and
	// assume() updates it before the lock is released.
	decideMu sync.Mutex

	mu      sync.Mutex
	waiting sets.Set[string] // pods (ns/name) waiting for devices
	// excluded are the nodes a pod was unschedulable on, loaded from and
	// saved to the pod's annotation ExcludedNodesAnnotation; see exclude.go.
	excluded map[types.UID]sets.Set[string]
	// rollbacks are claims a failed decision of a pod wrote and could not
	// roll back yet; see rollbackStale.
	rollbacks map[types.UID][]*resourceapi.ResourceClaim

	// gangCfg, hierarchy, podGroups (nil unless gangCfg.PodGroups),
	// gangRuns and reserve serve the gangs (gang*.go).
	gangCfg   GangConfig
	hierarchy *gang.Hierarchy
	podGroups schedulinglisters.PodGroupLister
	gangRuns  gangRuns
	reserve   reservations
	// gangDemand and gangDomains are guarded by decideMu.
	gangDemand  gang.DemandHistory
	gangDomains nodeDomains
	railMemo    railMemo
	// decided are the pods whose decision this controller wrote or is
	// writing, until they are deleted: users of their claims for the MPS
	// user check before kube-scheduler reserves the claims for them
	// (mpsusers.go).
	decided sets.Set[types.UID]
	// releasing are the claims whose allocation this controller is
	// removing itself, so that onDeallocated tells them from a
	// deallocation by kube-scheduler.
	releasing sets.Set[types.UID]
	// selectorAttempt: Config.SelectorAttempt.
	selectorAttempt time.Duration
	// unwanted are the allocated claims the clean-up found no live pod
	// for, since when (releaseWait).
	unwanted     map[types.UID]time.Time
	releaseGrace time.Duration
	// orphanReleases are the claims the clean-up is releasing as no pod's
	// (zero time), or whose release write failed, until when
	// (handover.go).
	orphanReleases map[types.UID]time.Time
	// placeCPUPods: Config.PlaceCPUPods.
	placeCPUPods bool
	// steering keeps the steering taints on nodes (steer.go).
	steering *steering
}

// New creates a controller and registers its informers. Call Run to start.
func New(cfg Config) (*Controller, error) {
	if cfg.Client == nil {
		return nil, errors.New("controller config: client is required")
	}
	if cfg.Recorder == nil {
		return nil, errors.New("controller config: event recorder is required")
	}
	if err := cfg.Policy.Validate(); err != nil {
		return nil, fmt.Errorf("controller config: %w", err)
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	if cfg.UnschedulableGrace <= 0 {
		cfg.UnschedulableGrace = 30 * time.Second
	}
	if cfg.SelectorAttempt <= 0 {
		cfg.SelectorAttempt = defaultSelectorAttempt
	}
	if cfg.ReleaseGrace <= 0 {
		cfg.ReleaseGrace = 2 * time.Second
	}
	if cfg.WaitingRetry <= 0 {
		cfg.WaitingRetry = time.Minute
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod,
		informers.WithTransform(transformObject))
	c := &Controller{
		client:          cfg.Client,
		factory:         factory,
		metrics:         cfg.Metrics,
		explain:         newExplainer(cfg.Recorder),
		workers:         cfg.Workers,
		grace:           cfg.UnschedulableGrace,
		retry:           cfg.WaitingRetry,
		selectorAttempt: cfg.SelectorAttempt,
		inv:             planner.NewInventory(),
		ledger:          planner.NewLedger(),
		fit:             planner.NewFitTracker(),
		ungating:        newUngating(),
		claimVersions:   newClaimVersions(),
		settles:         newReleaseSettles(),
		boundElsewhere:  sets.New[types.UID](),
		handledClaims:   newHandledClaims(),
		sel:             planner.NewSelectorEvaluator(),
		waiting:         sets.New[string](),
		excluded:        map[types.UID]sets.Set[string]{},
		decided:         sets.New[types.UID](),
		releasing:       sets.New[types.UID](),
		unwanted:        map[types.UID]time.Time{},
		orphanReleases:  map[types.UID]time.Time{},
		releaseGrace:    cfg.ReleaseGrace,
		placeCPUPods:    cfg.PlaceCPUPods,
		podQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpulink_pods"}),
		gcQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpulink_claims"}),
		holdQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.UID](),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "gpulink_deleted_claims"}),
		holdNS:    cfg.HoldNamespace,
		gangCfg:   cfg.Gangs,
		hierarchy: cfg.Gangs.Hierarchy,
		gangRuns:  gangRuns{busy: map[string][]string{}},
	}
	if c.hierarchy == nil {
		c.hierarchy = gang.DefaultHierarchy()
	}
	// Every level a gang can span has its series from the start: the
	// first gang placed on a level is then an increase that rate() and
	// increase() see, not a new series' first sample, which they drop.
	for level := 0; level <= c.hierarchy.Cluster(); level++ {
		c.metrics.GangsPlaced.WithLabelValues(c.hierarchy.Name(level))
	}
	if b := cfg.Gangs.PreferredStarvationBound; b < 0 {
		return nil, fmt.Errorf("controller config: gang preferred starvation bound %s: want 0 (the starvation bound) or more", b)
	}
	if b := cfg.Gangs.StrictReservationBound; b < 0 {
		return nil, fmt.Errorf("controller config: gang strict reservation bound %s: want 0 or more", b)
	}
	switch cfg.Gangs.DefaultPolicy {
	case "", gangs.Required, gangs.Preferred:
	default:
		return nil, fmt.Errorf("controller config: gang default policy %q: want Required or Preferred", cfg.Gangs.DefaultPolicy)
	}
	podInf := factory.Core().V1().Pods()
	claimInf := factory.Resource().V1().ResourceClaims()
	sliceInf := factory.Resource().V1().ResourceSlices()
	classInf := factory.Resource().V1().DeviceClasses()
	nodeInf := factory.Core().V1().Nodes()
	if err := podInf.Informer().AddIndexers(cache.Indexers{podClaimIndex: indexPodClaims, podGangIndex: c.indexPodGang}); err != nil {
		return nil, fmt.Errorf("adding pod index: %w", err)
	}
	if err := claimInf.Informer().AddIndexers(cache.Indexers{heldPodIndex: c.indexHeldPods}); err != nil {
		return nil, fmt.Errorf("adding claim index: %w", err)
	}
	c.pods = podInf.Lister()
	c.podIdx = podInf.Informer().GetIndexer()
	c.claims = claimInf.Lister()
	c.claimIdx = claimInf.Informer().GetIndexer()
	c.classes = classInf.Lister()
	c.nodes = nodeInf.Lister()
	c.interp = planner.NewInterpreter(c.classes, c.sel, c.inv)
	cfg.Metrics.inventory.setSource(c.inv, c.ledger)
	c.filter = &planner.NodeFilter{Nodes: c.nodes, Classes: c.classes, Fit: c.fit}
	if cfg.Gangs.StarvationBound > 0 {
		c.filter.Reserved = c.reservedAgainst
	}
	if cfg.RankByStranding {
		// A node's kept scores then also depend on its CPU and memory
		// left: a change of either counts like a change of its devices'
		// usage (pools are named after their nodes).
		c.fit.HostChanged = c.hostChanged
		c.filter.Allocatable.Changed = c.hostChanged
	}
	if err := c.newSteer(cfg); err != nil {
		return nil, err
	}
	var err error
	c.planner, err = planner.New(planner.Config{Policy: cfg.Policy, Mix: cfg.Mix, RankByStranding: cfg.RankByStranding,
		Parallelism: cfg.PlanWorkers, Inventory: c.inv, Ledger: c.ledger, Filter: c.filter, Selectors: c.sel, DemandChanged: c.demandChanged})
	if err != nil {
		return nil, fmt.Errorf("controller config: %w", err)
	}

	type handlerTarget interface {
		AddEventHandler(cache.ResourceEventHandler) (cache.ResourceEventHandlerRegistration, error)
	}
	// Slices come through the ResourceSlice tracker when DeviceTaintRules
	// apply: it delivers slices with the rules' taints patched in.
	var slices handlerTarget = sliceInf.Informer()
	c.stopTracker = func() {}
	if cfg.DeviceTaintRules {
		trackerCtx, cancel := context.WithCancel(context.Background())
		t, err := tracker.StartTracker(trackerCtx, tracker.Options{
			EnableDeviceTaintRules:   true,
			EnableConsumableCapacity: true,
			SliceInformer:            resourceinformers.ToTypedResourceSliceInformer(sliceInf),
			TaintInformer:            resourceinformers.ToTypedDeviceTaintRuleInformer(factory.Resource().V1().DeviceTaintRules()),
		})
		if err != nil {
			cancel()
			return nil, fmt.Errorf("starting ResourceSlice tracker for DeviceTaintRules: %w", err)
		}
		slices = t
		c.stopTracker = func() {
			t.Stop()
			cancel()
		}
	}
	regs := []struct {
		inf handlerTarget
		h   cache.ResourceEventHandler
	}{
		{podInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onPod, UpdateFunc: func(_, o any) { c.onPod(o) }, DeleteFunc: c.onPodDelete}},
		{claimInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onClaim, UpdateFunc: c.onClaimUpdate, DeleteFunc: c.onClaimDelete}},
		{slices, cache.ResourceEventHandlerFuncs{AddFunc: c.onSlice, UpdateFunc: func(_, o any) { c.onSlice(o) }, DeleteFunc: c.onSliceDelete}},
		{classInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onChange, UpdateFunc: func(_, o any) { c.onChange(o) }, DeleteFunc: c.onChange}},
		{nodeInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onNodeAdd, UpdateFunc: c.onNodeUpdate, DeleteFunc: c.onNodeDelete}},
	}
	if cfg.Gangs.PodGroups {
		pgInf := factory.Scheduling().V1beta1().PodGroups()
		c.podGroups = pgInf.Lister()
		regs = append(regs, struct {
			inf handlerTarget
			h   cache.ResourceEventHandler
		}{pgInf.Informer(), cache.ResourceEventHandlerFuncs{AddFunc: c.onPodGroup, UpdateFunc: func(_, o any) { c.onPodGroup(o) }, DeleteFunc: c.onPodGroup}})
	}
	for _, r := range regs {
		reg, err := r.inf.AddEventHandler(r.h)
		if err != nil {
			c.stopTracker()
			return nil, fmt.Errorf("adding event handler: %w", err)
		}
		// Waiting for the handlers, not just the stores, guarantees that
		// the ledger and inventory hold every existing claim and slice
		// before the first decision.
		c.synced = append(c.synced, reg.HasSynced)
	}
	return c, nil
}

// NewRecorder returns an events/v1 recorder and a function to stop it.
func NewRecorder(ctx context.Context, client kubernetes.Interface) (events.EventRecorder, func()) {
	b := events.NewBroadcaster(&events.EventSinkImpl{Interface: client.EventsV1()})
	b.StartRecordingToSink(ctx.Done())
	return b.NewRecorder(scheme.Scheme, "gpulink-controller"), b.Shutdown
}

// Run starts the informers, waits until every existing object has been
// seen, then processes pods and claims until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	logger := klog.FromContext(ctx)
	defer utilruntime.HandleCrashWithContext(ctx)
	defer c.podQueue.ShutDown()
	defer c.gcQueue.ShutDown()
	defer c.holdQueue.ShutDown()
	defer c.stopTracker()

	c.factory.Start(ctx.Done())
	defer c.factory.Shutdown()
	logger.Info("Waiting for informer caches")
	if !cache.WaitForCacheSync(ctx.Done(), c.synced...) {
		return fmt.Errorf("waiting for informer caches: %w", context.Cause(ctx))
	}
	c.seedDemand(ctx)
	c.steering.log(ctx)
	logger.Info("Caches synced; starting workers", "workers", c.workers)
	var wg sync.WaitGroup
	for range c.workers {
		wg.Go(func() {
			wait.UntilWithContext(ctx, func(ctx context.Context) { c.process(ctx, c.podQueue, c.syncPod) }, time.Second)
		})
	}
	wg.Go(func() {
		wait.UntilWithContext(ctx, func(ctx context.Context) { c.process(ctx, c.gcQueue, c.syncClaim) }, time.Second)
	})
	wg.Go(func() {
		wait.UntilWithContext(ctx, func(ctx context.Context) { process(ctx, c.holdQueue, c.syncKept) }, time.Second)
	})
	wg.Go(func() {
		wait.UntilWithContext(ctx, func(context.Context) { c.enqueueWaiting() }, c.retry)
	})
	wg.Go(func() { c.steering.run(ctx) })
	<-ctx.Done()
	c.podQueue.ShutDown()
	c.gcQueue.ShutDown()
	c.holdQueue.ShutDown()
	wg.Wait()
	return nil
}

// Ready reports whether the caches are synced.
func (c *Controller) Ready() bool {
	for _, s := range c.synced {
		if !s() {
			return false
		}
	}
	return true
}

func (c *Controller) process(ctx context.Context, q workqueue.TypedRateLimitingInterface[string], sync func(context.Context, string) error) {
	process(ctx, q, sync)
}

func process[K comparable](ctx context.Context, q workqueue.TypedRateLimitingInterface[K], sync func(context.Context, K) error) {
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		func() {
			defer q.Done(key)
			logger := klog.FromContext(ctx).WithValues("key", key)
			err := sync(klog.NewContext(ctx, logger), key)
			if err == nil {
				q.Forget(key)
				return
			}
			logger.V(2).Info("Retrying", "err", err)
			q.AddRateLimited(key)
		}()
	}
}
