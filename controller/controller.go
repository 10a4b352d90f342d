package controller

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
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
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/dynamic-resource-allocation/resourceslice/tracker"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/internal/sliceformat"
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
	// HoldNamespace is where the controller records the devices of
	// claims deleted while their pods still run (hold records, see
	// holds.go), so that kube-scheduler counts them too and a restarted
	// controller still does. Use a namespace only the controller and
	// cluster admins can write (the release namespace). Empty: such
	// devices are kept counted in this controller's memory only.
	HoldNamespace string
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
	sel      *planner.SelectorEvaluator
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
	if cfg.WaitingRetry <= 0 {
		cfg.WaitingRetry = time.Minute
	}
	factory := informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.ResyncPeriod,
		informers.WithTransform(transformObject))
	c := &Controller{
		client:   cfg.Client,
		factory:  factory,
		metrics:  cfg.Metrics,
		explain:  newExplainer(cfg.Recorder),
		workers:  cfg.Workers,
		grace:    cfg.UnschedulableGrace,
		retry:    cfg.WaitingRetry,
		inv:      planner.NewInventory(),
		ledger:   planner.NewLedger(),
		fit:      planner.NewFitTracker(),
		ungating: newUngating(),
		sel:      planner.NewSelectorEvaluator(),
		waiting:  sets.New[string](),
		excluded: map[types.UID]sets.Set[string]{},
		podQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpulink_pods"}),
		gcQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpulink_claims"}),
		holdQueue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[types.UID](),
			workqueue.TypedRateLimitingQueueConfig[types.UID]{Name: "gpulink_deleted_claims"}),
		holdNS: cfg.HoldNamespace,
	}
	podInf := factory.Core().V1().Pods()
	claimInf := factory.Resource().V1().ResourceClaims()
	sliceInf := factory.Resource().V1().ResourceSlices()
	classInf := factory.Resource().V1().DeviceClasses()
	nodeInf := factory.Core().V1().Nodes()
	if err := podInf.Informer().AddIndexers(cache.Indexers{podClaimIndex: indexPodClaims}); err != nil {
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
	if cfg.RankByStranding {
		// A node's kept scores then also depend on its CPU and memory
		// left: a change of either counts like a change of its devices'
		// usage (pools are named after their nodes).
		c.fit.HostChanged = c.ledger.Touch
		c.filter.Allocatable.Changed = c.ledger.Touch
	}
	var err error
	c.planner, err = planner.New(planner.Config{Policy: cfg.Policy, Mix: cfg.Mix, RankByStranding: cfg.RankByStranding,
		Inventory: c.inv, Ledger: c.ledger, Filter: c.filter, Selectors: c.sel})
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

// indexPodClaims returns namespace/name of every claim a pod uses.
func indexPodClaims(obj any) ([]string, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	// PodClaims yields claims named directly (resourceClaimName) as well
	// as those created from templates.
	for name := range resourceclaim.PodClaims(pod) {
		keys = append(keys, pod.Namespace+"/"+name)
	}
	return keys, nil
}

func (c *Controller) onPod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return
	}
	// Every pod counts for the node fit, GPU pods or not.
	c.fit.Observe(pod)
	if len(pod.Spec.ResourceClaims) == 0 && gateIndex(pod) < 0 {
		return
	}
	if planner.PodDone(pod) {
		// A finished pod's reservations are dropped now, not at the next
		// resync or when the pod is deleted.
		c.enqueuePodClaimsGC(pod)
		c.podEndedForHolds(pod)
	}
	c.podQueue.Add(pod.Namespace + "/" + pod.Name)
}

// enqueuePodClaimsGC queues the claims of a pod that is gone or finished
// for cleanup.
func (c *Controller) enqueuePodClaimsGC(pod *corev1.Pod) {
	for name := range resourceclaim.PodClaims(pod) {
		c.gcQueue.Add(pod.Namespace + "/" + name)
	}
}

func (c *Controller) onPodDelete(obj any) {
	pod, ok := deletedObject[*corev1.Pod](obj)
	if !ok {
		return
	}
	key := pod.Namespace + "/" + pod.Name
	c.fit.Forget(pod.UID)
	c.ungating.done(pod.UID)
	c.explain.forget(pod.UID)
	c.mu.Lock()
	delete(c.excluded, pod.UID)
	delete(c.rollbacks, pod.UID)
	c.waiting.Delete(key)
	c.metrics.PendingPods.Set(float64(c.waiting.Len()))
	c.mu.Unlock()
	c.enqueuePodClaimsGC(pod)
	c.podEndedForHolds(pod)
	c.podQueue.Add(key)
}

func (c *Controller) onClaim(obj any) {
	claim, ok := obj.(*resourceapi.ResourceClaim)
	if !ok {
		return
	}
	if c.isHoldRecord(claim) {
		uses, kept := recordUses(claim)
		c.ledger.ObserveRecord(claim, uses, kept)
		c.gcQueue.Add(claim.Namespace + "/" + claim.Name)
		return
	}
	c.ledger.Observe(claim)
	c.enqueueClaimPods(claim)
	if hasFinalizer(claim) {
		c.gcQueue.Add(claim.Namespace + "/" + claim.Name)
	}
}

func (c *Controller) onClaimUpdate(oldObj, newObj any) {
	c.onClaim(newObj)
	old, ok1 := oldObj.(*resourceapi.ResourceClaim)
	cur, ok2 := newObj.(*resourceapi.ResourceClaim)
	if ok1 && ok2 && old.Status.Allocation != nil && cur.Status.Allocation == nil {
		c.onDeallocated(old)
		// Devices were freed: pods waiting for them may fit now.
		c.enqueueWaiting()
	}
}

func (c *Controller) onClaimDelete(obj any) {
	claim, ok := deletedObject[*resourceapi.ResourceClaim](obj)
	if !ok {
		return
	}
	if c.isHoldRecord(claim) {
		c.ledger.Forget(claim.UID)
		c.enqueueWaiting()
		return
	}
	// A claim deleted while pods that reserved it may still run keeps
	// its devices counted until they end (holds.go); the finalizer that
	// should prevent that can be removed by the claim's owner.
	if !c.keepDeletedClaim(claim) {
		c.ledger.Forget(claim.UID)
		c.enqueueWaiting()
	}
	c.enqueueClaimPods(claim)
}

// deletedObject unwraps the object of a delete notification, which may
// come as a tombstone when the watch missed the deletion.
func deletedObject[T any](obj any) (T, bool) {
	if t, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = t.Obj
	}
	o, ok := obj.(T)
	return o, ok
}

// enqueueClaimPods enqueues the pods that use or reserve a claim.
func (c *Controller) enqueueClaimPods(claim *resourceapi.ResourceClaim) {
	for _, r := range claim.Status.ReservedFor {
		if r.Resource == "pods" && r.APIGroup == "" {
			c.podQueue.Add(claim.Namespace + "/" + r.Name)
		}
	}
	for _, o := range claim.OwnerReferences {
		if o.Kind == "Pod" && o.APIVersion == "v1" {
			c.podQueue.Add(claim.Namespace + "/" + o.Name)
		}
	}
	objs, err := c.podIdx.ByIndex(podClaimIndex, claim.Namespace+"/"+claim.Name)
	if err != nil {
		return
	}
	for _, o := range objs {
		if pod, ok := o.(*corev1.Pod); ok {
			c.podQueue.Add(pod.Namespace + "/" + pod.Name)
		}
	}
}

func (c *Controller) onSlice(obj any) {
	slice, ok := obj.(*resourceapi.ResourceSlice)
	if !ok {
		return
	}
	// Other drivers' slices are kept too (planner.Inventory), for claims
	// that ask for their devices with gpulink's.
	if err := c.inv.Upsert(slice); err != nil {
		c.metrics.Errors.WithLabelValues(errReasonInventory).Inc()
		var foreign *sliceformat.ForeignPoolError
		if errors.As(err, &foreign) {
			// Someone with write access to slices (a node's kubelet plugin
			// where the chart's admission policy is missing) tries to
			// speak for another node: worth an event an administrator
			// sees, not only a log line.
			klog.Background().Error(err, "Ignoring ResourceSlice whose pool is named after another node", "pool", slice.Spec.Pool.Name, "slice", klog.KObj(slice))
			c.explain.rec.Eventf(slice, nil, corev1.EventTypeWarning, report.ReasonSliceIgnored, actionInventory, "%s", err.Error())
		} else {
			klog.Background().Error(err, "Ignoring unusable gpulink pool", "pool", slice.Spec.Pool.Name, "slice", klog.KObj(slice))
		}
	}
	c.enqueueWaiting()
}

func (c *Controller) onSliceDelete(obj any) {
	slice, ok := deletedObject[*resourceapi.ResourceSlice](obj)
	if !ok {
		return
	}
	c.inv.Remove(slice)
	c.enqueueWaiting()
}

func (c *Controller) onNodeAdd(obj any) {
	if node, ok := obj.(*corev1.Node); ok {
		c.filter.Allocatable.Set(node)
	}
	c.onChange(obj)
}

func (c *Controller) onNodeUpdate(oldObj, newObj any) {
	old, ok1 := oldObj.(*corev1.Node)
	cur, ok2 := newObj.(*corev1.Node)
	if ok1 && ok2 && old.ResourceVersion == cur.ResourceVersion {
		return
	}
	if ok2 {
		c.filter.Allocatable.Set(cur)
	}
	if ok1 && ok2 && old.Spec.Unschedulable == cur.Spec.Unschedulable && apiequality.Semantic.DeepEqual(old.Spec.Taints, cur.Spec.Taints) && maps.Equal(old.Labels, cur.Labels) {
		// Other status-only updates (heartbeats) change nothing the
		// controller uses.
		return
	}
	c.onChange(newObj)
}

func (c *Controller) onNodeDelete(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if node, ok := obj.(*corev1.Node); ok {
		c.filter.Allocatable.Forget(node.Name)
	}
	c.onChange(obj)
}

// onChange retries waiting pods after a change that may help them.
func (c *Controller) onChange(any) { c.enqueueWaiting() }

func (c *Controller) enqueueWaiting() {
	c.mu.Lock()
	keys := c.waiting.UnsortedList()
	c.mu.Unlock()
	for _, k := range keys {
		c.podQueue.Add(k)
	}
}

func (c *Controller) setWaiting(key string, waiting bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if waiting {
		c.waiting.Insert(key)
	} else {
		c.waiting.Delete(key)
	}
	c.metrics.PendingPods.Set(float64(c.waiting.Len()))
}

// onDeallocated reacts to an allocation being removed. When kube-scheduler
// finds a pod unschedulable on the node its claims are allocated on, its
// DRA plugin deallocates claims reserved only for that pod so that they
// can be allocated elsewhere (PostFilter). Allocating on the same node
// again would loop, so the node is excluded for the pods that held the
// claim, as after the controller's own unschedulable release.
func (c *Controller) onDeallocated(old *resourceapi.ResourceClaim) {
	if !hasFinalizer(old) {
		return
	}
	node := allocatedNode(old)
	if node == "" {
		return
	}
	for _, r := range old.Status.ReservedFor {
		if r.Resource != "pods" || r.APIGroup != "" {
			continue
		}
		pod, err := c.pods.Pods(old.Namespace).Get(r.Name)
		if err != nil || pod.UID != r.UID || pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil || gateIndex(pod) >= 0 {
			continue
		}
		c.exclude(pod, node)
		c.fit.Unassume(pod.UID)
		why := "kube-scheduler could not place the pod there and deallocated the claim"
		if podUnschedulable(pod) {
			why += ": " + unschedulableMessage(pod)
		}
		c.explain.event(pod, old, corev1.EventTypeWarning, report.ReasonReleased, actionRelease,
			fmt.Sprintf("allocation on node %s was released (%s); trying other nodes", node, why))
		c.metrics.Released.WithLabelValues("scheduler").Inc()
		c.podQueue.Add(pod.Namespace + "/" + pod.Name)
	}
}
