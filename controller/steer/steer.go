// Package steer keeps gpulink's soft taints on GPU nodes: a PreferNoSchedule
// taint (TaintKey) on every node whose gpulink GPUs are not all taken, so
// that kube-scheduler sends pods without GPU claims to nodes whose GPUs
// are already allocated, or to nodes without GPUs, whenever one fits them,
// and a second one (ScarceTaintKey) on the idle nodes that the scarcest
// GPU pods of the recent mix need, so that such pods go there last
// (docs/cpu-pods.md).
//
// Why a PreferNoSchedule taint: kube-scheduler's default profile scores
// nodes with TaintToleration at weight 3, and its NormalizeScore
// (helper.DefaultNormalizeScore with reverse=true) gives a node 0 points
// when it carries a PreferNoSchedule taint the pod does not tolerate and
// another feasible node carries none, and that node 100: 300 points after
// the weight, more than NodeResourcesFit's and BalancedAllocation's
// spreading can add up to (100 each, weight 1). The pod therefore goes to
// an untainted node whenever one fits it, and spreads as before otherwise.
// Nothing is gated, no pod waits for gpulink, and a stock kube-scheduler
// does it. A pod with gpulink claims is not affected: its claims'
// allocation pins it to one node, and kube-scheduler does not score a
// single feasible node.
//
// kube-scheduler's TaintToleration scores a node by the count of
// PreferNoSchedule taints the pod does not tolerate, so a node with both
// taints ranks below a node with one, which ranks below a node with none.
//
// A Reconciler is the controller's writer of one such taint: a workqueue of
// node names (coalescing: a node queued twice is synced once), one worker,
// and a token bucket in front of every node write, so that thousands of
// nodes filling at once do not flood the API server. It writes only when
// the node's taint differs from what it should be, and touches no other
// taint, label or field of the node (the chart's ValidatingAdmissionPolicy
// <release>-controller-nodes holds it to that).
package steer

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/util/flowcontrol"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"
)

// TaintKey is the steering taint's key; its effect is always
// PreferNoSchedule and it has no value.
const TaintKey = "gpu.gpulink.dev/free-gpus"

// Taint is the steering taint as the controller writes it.
var Taint = corev1.Taint{Key: TaintKey, Effect: corev1.TaintEffectPreferNoSchedule}

// ScarceTaintKey is the second steering taint's key, on the nodes kept
// whole for the scarce shapes of the demand mix
// (allocate.DemandMix.Reserve); PreferNoSchedule, no value.
const ScarceTaintKey = "gpu.gpulink.dev/scarce-gpus"

// ScarceTaint is the second steering taint as the controller writes it.
var ScarceTaint = corev1.Taint{Key: ScarceTaintKey, Effect: corev1.TaintEffectPreferNoSchedule}

// Taints are the steering taints, every taint a Reconciler may write.
var Taints = []corev1.Taint{Taint, ScarceTaint}

// Modes of --steer-cpu-pods.
const (
	// ModeTaint keeps the taint on the GPU nodes with an idle GPU.
	ModeTaint = "taint"
	// ModeOff keeps it on no node: the controller removes the taints it
	// left, once at start-up, and writes none.
	ModeOff = "off"
)

// Defaults of Config.
const (
	DefaultWritesPerSecond = 20
	DefaultBurst           = 100
)

// fieldManager names the controller in the nodes' managedFields.
const fieldManager = "gpulink-controller"

// Config configures a Reconciler.
type Config struct {
	Client kubernetes.Interface
	// Nodes is the controller's node lister (its informer must be
	// running and synced before Run).
	Nodes corelisters.NodeLister
	// Taint is the taint this Reconciler keeps: one of Taints.
	Taint corev1.Taint
	// Enabled: the taint follows Want; off, it is removed where present.
	Enabled bool
	// Want tells whether a node should carry the taint now (Enabled
	// only). Called from the worker; it must be safe for concurrent use
	// with the controller.
	Want func(node string) bool
	// Limiter, when set, bounds the node patches, and may be shared by
	// several Reconcilers so that their writes count against one budget;
	// otherwise WritesPerSecond and Burst make one (NewLimiter).
	Limiter         flowcontrol.RateLimiter
	WritesPerSecond float32
	Burst           int
	// Writes, when set, is called after each node patch the API server
	// accepted (added: the taint was added, else removed): for metrics.
	Writes func(added bool)
}

// Reconciler keeps the steering taint of every node in step with Want.
type Reconciler struct {
	client  kubernetes.Interface
	nodes   corelisters.NodeLister
	taint   corev1.Taint
	enabled bool
	want    func(string) bool
	limiter flowcontrol.RateLimiter
	writes  func(bool)
	queue   workqueue.TypedRateLimitingInterface[string]
}

// New returns a Reconciler; Run starts it.
func New(cfg Config) (*Reconciler, error) {
	if cfg.Client == nil || cfg.Nodes == nil {
		return nil, fmt.Errorf("steer config: client and node lister are required")
	}
	if !slices.ContainsFunc(Taints, func(t corev1.Taint) bool { return t.MatchTaint(&cfg.Taint) && t.Value == cfg.Taint.Value }) {
		return nil, fmt.Errorf("steer config: taint %s:%s is not a steering taint (%s:%s or %s:%s)",
			cfg.Taint.Key, cfg.Taint.Effect, TaintKey, Taint.Effect, ScarceTaintKey, ScarceTaint.Effect)
	}
	if cfg.Enabled && cfg.Want == nil {
		return nil, fmt.Errorf("steer config: want is required when enabled")
	}
	limiter := cfg.Limiter
	if limiter == nil {
		var err error
		if limiter, err = NewLimiter(cfg.WritesPerSecond, cfg.Burst); err != nil {
			return nil, err
		}
	}
	return &Reconciler{
		client: cfg.Client, nodes: cfg.Nodes, taint: cfg.Taint, enabled: cfg.Enabled, want: cfg.Want, writes: cfg.Writes,
		limiter: limiter,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpulink_steer_" + strings.ReplaceAll(path.Base(cfg.Taint.Key), "-", "_")}),
	}, nil
}

// NewLimiter is the token bucket of the node patches: writesPerSecond and
// burst, DefaultWritesPerSecond and DefaultBurst when 0.
func NewLimiter(writesPerSecond float32, burst int) (flowcontrol.RateLimiter, error) {
	if writesPerSecond < 0 || burst < 0 {
		return nil, fmt.Errorf("steer config: writesPerSecond %v and burst %d must be >= 0", writesPerSecond, burst)
	}
	if writesPerSecond == 0 {
		writesPerSecond = DefaultWritesPerSecond
	}
	if burst == 0 {
		burst = DefaultBurst
	}
	return flowcontrol.NewTokenBucketRateLimiter(writesPerSecond, burst), nil
}

// Key is the key of the taint this Reconciler keeps.
func (r *Reconciler) Key() string { return r.taint.Key }

// Enqueue asks for the node's taint to be checked. Cheap and safe to call
// from informer handlers and under the controller's locks: a node already
// queued is not queued twice.
func (r *Reconciler) Enqueue(node string) {
	if node != "" {
		r.queue.Add(node)
	}
}

// NodeChanged is for the node informer's add and update handlers: a new
// node, or one whose taints changed (someone else's write, or ours seen
// back), is checked; other node updates (status, labels) cannot change
// whether it should carry the taint, and are not.
func (r *Reconciler) NodeChanged(old, cur *corev1.Node) {
	if cur == nil {
		return
	}
	if old == nil || !taintsEqual(old.Spec.Taints, cur.Spec.Taints) {
		r.Enqueue(cur.Name)
	}
}

func taintsEqual(a, b []corev1.Taint) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !a[i].MatchTaint(&b[i]) || a[i].Value != b[i].Value {
			return false
		}
	}
	return true
}

// Run checks every node once, then what is enqueued, until ctx ends. The
// node lister must be synced.
func (r *Reconciler) Run(ctx context.Context) {
	defer utilruntime.HandleCrashWithContext(ctx)
	defer r.queue.ShutDown()
	nodes, err := r.nodes.List(labels.Everything())
	if err != nil {
		klog.FromContext(ctx).Error(err, "Listing nodes for the steering taint; only nodes that change will be checked")
	}
	for _, n := range nodes {
		r.Enqueue(n.Name)
	}
	go func() {
		<-ctx.Done()
		r.queue.ShutDown()
	}()
	for r.processNext(ctx) {
	}
}

func (r *Reconciler) processNext(ctx context.Context) bool {
	node, quit := r.queue.Get()
	if quit {
		return false
	}
	defer r.queue.Done(node)
	logger := klog.FromContext(ctx).WithValues("node", node)
	if err := r.sync(klog.NewContext(ctx, logger), node); err != nil {
		if ctx.Err() == nil {
			logger.V(2).Info("Retrying the steering taint", "err", err)
			r.queue.AddRateLimited(node)
		}
		return true
	}
	r.queue.Forget(node)
	return true
}

// taintIndex is the index of taint (key and effect) in taints, -1 if
// absent.
func taintIndex(taints []corev1.Taint, taint *corev1.Taint) int {
	for i := range taints {
		if taints[i].MatchTaint(taint) {
			return i
		}
	}
	return -1
}

// hasTaint tells whether taints hold taint (key and effect).
func hasTaint(taints []corev1.Taint, taint *corev1.Taint) bool { return taintIndex(taints, taint) >= 0 }

// sync brings one node's taint in step: nothing when it already is.
func (r *Reconciler) sync(ctx context.Context, name string) error {
	node, err := r.nodes.Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("node %s: %w", name, err)
	}
	want := r.enabled && r.want(name)
	if hasTaint(node.Spec.Taints, &r.taint) == want {
		return nil
	}
	if err := r.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("node %s: waiting to write: %w", name, err)
	}
	err = r.patch(ctx, node, want)
	if err != nil && !apierrors.IsNotFound(err) {
		// The cache's node was stale (its taints changed meanwhile, so a
		// test of the patch failed): once more with the API server's.
		fresh, gerr := r.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
		if gerr != nil {
			return fmt.Errorf("node %s: %w (and reading it again: %w)", name, err, gerr)
		}
		if hasTaint(fresh.Spec.Taints, &r.taint) == want {
			return nil
		}
		err = r.patch(ctx, fresh, want)
	}
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("node %s: %s the steering taint %s: %w", name, verb(want), r.taint.Key, err)
	}
	if r.writes != nil {
		r.writes(want)
	}
	klog.FromContext(ctx).V(4).Info("Steering taint written", "taint", r.taint.Key, "action", verb(want))
	return nil
}

func verb(add bool) string {
	if add {
		return "adding"
	}
	return "removing"
}

// patchOp is one JSON patch (RFC 6902) operation.
type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value,omitempty"`
}

// Patch is the JSON patch that adds (add) or removes taint, one of
// Taints, on a node whose taints are as in node, and nothing else. It is written
// so that the API server applies it only to those taints, whatever else
// changed: an addition appends to the list (the server refuses a second
// taint of the same key and effect), a removal tests the key and effect
// at the index it removes, and the first taint of a node without any is
// written only if the node's resourceVersion is still node's. It returns
// nil when there is nothing to do.
func Patch(node *corev1.Node, taint corev1.Taint, add bool) ([]byte, error) {
	taints := node.Spec.Taints
	var ops []patchOp
	switch {
	case add && hasTaint(taints, &taint):
		return nil, nil
	case add && len(taints) == 0:
		if node.ResourceVersion != "" {
			// Always so from an API server; not from every fake.
			ops = append(ops, patchOp{Op: "test", Path: "/metadata/resourceVersion", Value: node.ResourceVersion})
		}
		ops = append(ops, patchOp{Op: "add", Path: "/spec/taints", Value: []corev1.Taint{taint}})
	case add:
		ops = []patchOp{{Op: "add", Path: "/spec/taints/-", Value: taint}}
	default:
		at := taintIndex(taints, &taint)
		if at < 0 {
			return nil, nil
		}
		p := fmt.Sprintf("/spec/taints/%d", at)
		ops = []patchOp{
			{Op: "test", Path: p + "/key", Value: taint.Key},
			{Op: "test", Path: p + "/effect", Value: string(taint.Effect)},
			{Op: "remove", Path: p},
		}
	}
	return json.Marshal(ops)
}

func (r *Reconciler) patch(ctx context.Context, node *corev1.Node, add bool) error {
	data, err := Patch(node, r.taint, add)
	if err != nil || data == nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	_, err = r.client.CoreV1().Nodes().Patch(ctx, node.Name, types.JSONPatchType, data, metav1.PatchOptions{FieldManager: fieldManager})
	return err
}
