package planner

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// Config configures a Planner. Inventory, Ledger and Filter are the state
// the controller's informers keep current; the Planner reads them.
type Config struct {
	// Policy is the packing strategy at node and GPU level.
	Policy allocate.Policy
	// Mix configures the recent request-size mix passed to the allocator.
	Mix MixConfig
	// RankByStranding ranks nodes by the GPUs a placement strands for the
	// recent pods' shapes, counting each node's CPU and memory left.
	RankByStranding bool
	Inventory       *Inventory
	Ledger          *Ledger
	Filter          *NodeFilter
	Selectors       *SelectorEvaluator
	// DemandChanged, when set, is told each time the weights of the
	// demand mix change (ranking by stranding only), under the caller's
	// decision lock: ReservedForScarce may then answer otherwise for any
	// node. It must not block.
	DemandChanged func()
	// Parallelism is how many workers a decision plans nodes with where
	// it plans them one by one (parallel.go); 0 means
	// DefaultParallelism, 1 plans on the caller's goroutine only.
	Parallelism int
}

// Planner chooses the node and the devices of a pod's pending claims: the
// one place where the node is chosen. It is not safe for concurrent use:
// the controller calls Decide and Record under its decision lock, so that
// a decision's devices are assumed in the ledger before the next one.
type Planner struct {
	policy allocate.Policy
	mix    *MixRecorder
	demand *demandRecorder
	inv    *Inventory
	ledger *Ledger
	filter *NodeFilter
	sel    *SelectorEvaluator
	// scores keeps nodes' scores per request shape between decisions
	// (quickChoice).
	scores *scoreCache
	// slots keeps nodes' counts of a gang's copies between decisions
	// (Slots).
	slots *slotCache
	// usage keeps the nodes' GPU usage between weighings of the demand
	// mix (nodesNowOf).
	usage *usageCache
	// waiting keeps the nodes without room for the claims of GPU+NIC pods
	// that wait (chooseForeign).
	waiting *waitingMisses
	// parallelism is Config.Parallelism, defaulted.
	parallelism int
}

// New returns a Planner over the state in cfg.
func New(cfg Config) (*Planner, error) {
	if cfg.Inventory == nil || cfg.Ledger == nil || cfg.Filter == nil || cfg.Selectors == nil {
		return nil, fmt.Errorf("planner config: inventory, ledger, filter and selectors are required")
	}
	mix, err := NewMixRecorder(cfg.Mix)
	if err != nil {
		return nil, fmt.Errorf("planner config: %w", err)
	}
	demand, err := newDemandRecorder(cfg.RankByStranding)
	if err != nil {
		return nil, fmt.Errorf("planner config: %w", err)
	}
	if demand.hist != nil {
		demand.products = newProductAdmission(cfg.Inventory, cfg.Selectors)
		demand.changed = cfg.DemandChanged
	}
	if cfg.Parallelism < 0 {
		return nil, fmt.Errorf("planner config: parallelism must be 0 (one worker per CPU) or more, got %d", cfg.Parallelism)
	}
	parallelism := cfg.Parallelism
	if parallelism == 0 {
		parallelism = DefaultParallelism()
	}
	return &Planner{parallelism: parallelism, policy: cfg.Policy, mix: mix, demand: demand, inv: cfg.Inventory, ledger: cfg.Ledger,
		filter: cfg.Filter, sel: cfg.Selectors, scores: newScoreCache(), slots: newSlotCache(), usage: newUsageCache(), waiting: newWaitingMisses()}, nil
}

// Request is one pod's decision to take.
type Request struct {
	Pod *corev1.Pod
	// Pending are the pod's gpulink claims to allocate now, none held.
	Pending []*Claim
	// Allocated are the pod's claims already allocated, by any driver:
	// their node selectors bind the node.
	Allocated []*resourceapi.ResourceClaim
	// Excluded are the nodes the pod was unschedulable on before.
	Excluded sets.Set[string]
	// Placement is the pod's own placement policy (PodPlacement).
	Placement Placement
	// Only, when set, restricts the decision to that node: a gang's
	// placement chose the node, the planner chooses its devices.
	Only string
	// Within, when not nil, restricts the decision to these nodes (a
	// further pod of a gang that must stay in one domain).
	Within []string
	// HeldOff are other drivers' devices the decision takes as held
	// besides the ledger's holds (a further pod of a gang with aligned
	// rails: the NICs of the other rails). A waiting pod's nodes without
	// room are kept under its key.
	HeldOff HeldOff
}

// Decision is what Decide found.
type Decision struct {
	// Chosen is the plan to write; nil when nothing fits.
	Chosen *Plan
	// Plans are feasible plans of other nodes, for the event.
	Plans []*Plan
	// Why says why some nodes' devices did not fit.
	Why []string
	// Rejections counts the nodes the node filter turned down, by reason.
	Rejections *Rejections
	// Unexamined counts nodes not planned because they cannot beat Chosen.
	Unexamined int
	// Nodes is the number of nodes with gpulink devices.
	Nodes int
	// ExclusionsIgnored is set when every node was ruled out, some by
	// Request.Excluded: the nodes were then considered again, and the
	// caller should forget the exclusions rather than wait forever for a
	// condition that may have cleared.
	ExclusionsIgnored bool
}

// Decide chooses the node and devices for req's pending claims: the
// shortcut over kept scores for one device set, branch and bound for
// several, planning every admitted node when neither can conclude, and
// the MIG planner for MIG devices. All paths choose what planning every
// node would choose (TestQuickChoiceMatchesExhaustive,
// TestBoundChoiceMatchesExhaustive).
func (p *Planner) Decide(ctx context.Context, req Request) Decision {
	logger := klog.FromContext(ctx)
	pod, pending, allocated, excluded := req.Pod, req.Pending, req.Allocated, req.Excluded
	var all []*NodeInventory
	if req.Only != "" {
		// Not the whole inventory: a gang decides one node per pod.
		if n := p.inv.Node(req.Only); n != nil {
			all = []*NodeInventory{n}
		}
	} else {
		// Read only (a Within decision below copies it).
		all = p.inv.sortedNodes()
	}
	if req.Within != nil {
		// A set: a gang's domain may be a spine of hundreds of nodes.
		in := sets.New(req.Within...)
		all = slices.DeleteFunc(slices.Clone(all), func(n *NodeInventory) bool { return !in.Has(n.Node) })
	}
	d := Decision{Nodes: len(all)}
	pol := req.Placement.apply(p.demand.policy(p.mix.Policy(ctx, p.policy, pending), p.nodesNowOf(all)))
	rank := p.demand.ranking(p.filter.HostLeft, pod)
	// candidates filters every node, considering them all again when the
	// exclusions ruled out every one of them.
	candidates := func() []*NodeInventory {
		cands, rej := p.filter.Candidates(logger, pod, all, allocated, excluded)
		if len(cands) == 0 && excluded.Len() > 0 && rej.count(rejectExcluded) > 0 {
			d.ExclusionsIgnored = true
			cands, rej = p.filter.Candidates(logger, pod, all, allocated, nil)
		}
		d.Rejections = rej
		return cands
	}
	noFit := "no " + wantedDevices(pending)
	if wantsForeign(pending) && !wantsMIG(pending) {
		var failed int
		d.Chosen, d.Plans, d.Why, failed = p.chooseForeign(ctx, pol, candidates(), pending, req.HeldOff, rank)
		for range failed {
			d.Rejections.add(noFit)
		}
		return d
	}
	if wantsMIG(pending) {
		var failed int
		d.Chosen, d.Plans, d.Why, failed = chooseMIG(ctx, p.sel, pol, candidates(), p.ledger, pending, rank)
		for range failed {
			d.Rejections.add(noFit)
		}
		return d
	}
	if req.Only == "" && req.Within == nil {
		p.scores.prune(all)
		p.scores.inventory(all)
	}
	pf := p.filter.forPod(logger, pod, allocated, excluded)
	q, verdict := quickChoice(ctx, p.sel, pol, all, p.ledger, p.scores, pf.admit, pending, rank)
	var bounded *Plan
	if verdict == quickUnsure {
		// Pods with several device sets keep podScore's ranking.
		podPol := pol
		podPol.Demand = nil
		bounded, verdict = boundChoice(ctx, p.sel, podPol, all, p.ledger, p.scores, pf.admit, pending)
	}
	quickWait := false
	if verdict == quickNoFit && excluded.Len() == 0 {
		// Nothing fits: count every node by filter as the exhaustive
		// path does (the nodes admitted fit no GPUs), planning only a
		// few of them for the reasons.
		var cands []*NodeInventory
		cands, d.Rejections = p.filter.Candidates(logger, pod, all, allocated, nil)
		d.Why, quickWait = explainNoFit(ctx, p.sel, pol, cands, p.ledger, pending)
		if quickWait {
			for range cands {
				d.Rejections.add(noFit)
			}
		}
	}
	switch {
	case verdict == quickChosen && q != nil:
		d.Chosen = q.plan
		// The event names a few nodes that also fit (gpulink explain):
		// plan a bounded number of the next-best ones for it.
		d.Plans, d.Why, d.Unexamined = q.alternatives(ctx, p.sel, pol, p.ledger, pf.admit, pending)
		d.Rejections = pf.rej
	case verdict == quickChosen:
		d.Chosen, d.Plans, d.Rejections = bounded, []*Plan{bounded}, pf.rej
	case !quickWait:
		plans, failed, why := exhaustivePlans(ctx, p.sel, pol, candidates(), p.ledger.NodeUsage, pending)
		for range failed {
			d.Rejections.add(noFit)
		}
		d.Plans, d.Why = plans, why
		d.Chosen = choosePlan(plans, pol, rank)
	}
	return d
}

// Record notes a decision that is being written: the demand mix of
// ranking by stranding learns the pod's shape.
func (p *Planner) Record(ctx context.Context, pod *corev1.Pod, chosen *Plan) {
	p.demand.record(ctx, pod, chosen)
	p.weighDemand()
}

// WaitingMessage explains why nothing fits: which filter rejected how
// many of the nodes with gpulink devices, as kube-scheduler's
// FailedScheduling message does, then a few per-node details.
func (p *Planner) WaitingMessage(pending []*Claim, d Decision) string {
	msg := "waiting: "
	switch {
	case d.Nodes == 0:
		msg += "no node publishes gpulink devices yet"
		if problems := p.inv.ProblemsSnapshot(); len(problems) > 0 {
			// Name the first pool by name, so that the message (and thus
			// the explainer's deduplication) is stable across retries.
			pool := slices.Min(slices.Collect(maps.Keys(problems)))
			msg += fmt.Sprintf("; pool %s unusable: %s", pool, problems[pool])
		}
		return msg
	case d.Rejections == nil:
		msg += fmt.Sprintf("no node has %s", wantedDevices(pending))
	}
	var skipped []string
	if d.Rejections != nil {
		msg += d.Rejections.summary(d.Nodes)
		skipped = d.Rejections.Details
	}
	details := append(dedupe(d.Why), skipped...)
	if len(details) > 4 {
		details = append(details[:4], fmt.Sprintf("and %d more", len(details)-4))
	}
	if len(details) > 0 {
		msg += " (" + strings.Join(details, "; ") + ")"
	}
	return msg
}

// HeldOffByReservation tells whether the node filter turned down some
// node because a gang's starvation reservation holds it (NodeFilter.Reserved).
func (d Decision) HeldOffByReservation() bool {
	return d.Rejections.HeldOffByReservation()
}
