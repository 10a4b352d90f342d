package controller

import (
	"context"
	"fmt"
	"strings"

	"github.com/gpulink/gpulink/driver/allocate"
)

// quickChoice decides a pod with a single placement (one claim, one
// request, no firstAvailable, no matchAttribute, whole GPUs by count or
// one share) without planning every candidate node, and returns the plan
// choosePlan would have picked among the plans of all of them; ok is
// false when the pod is not of that shape or the shortcut cannot vouch
// for the answer, and the caller then plans every node.
//
// Why it is exact: for such a pod every feasible plan has RankSum 0, and
// choosePlan ranks them by allocate.ChooseNode over each node's usage with
// the plan's ineligible devices masked as taken. The plan's eligible
// devices are the ones that pass the selectors (memoised per node), the
// taints and, for shares, shareability and one share size; they can be
// computed without the allocator. So ChooseNode over every candidate's
// masked usage gives the same node, and it already skips the search on
// nodes whose best conceivable link cannot win (upperBound), which is
// what makes the decision cheap on large clusters: only the winner is then
// planned, which gives the same devices as planning it among all the
// others. Whenever a node's devices would split into several share sizes,
// or nodes disagree on the share size (choosePlan then ranks by the first
// node's size), or nothing fits (the exhaustive path explains why), ok is
// false.
func quickChoice(ctx context.Context, sel *selectorEvaluator, pol allocate.Policy, cands []*nodeInventory, usageOf func(*nodeInventory) []allocate.GPUUsage, pending []*interpretedClaim) (*nodePlan, bool) {
	if len(pending) != 1 || len(cands) < 2 {
		return nil, false
	}
	ic := pending[0]
	if len(ic.Requests) != 1 || len(ic.Constraints) != 0 || len(ic.Requests[0].Alternatives) != 1 {
		return nil, false
	}
	alt := ic.Requests[0].Alternatives[0]
	if alt.All || alt.Count < 1 || (alt.Share && alt.Count != 1) {
		return nil, false
	}
	req := allocate.Request{GPUs: alt.Count, RequiredLink: alt.RequiredLink}
	shareKey := ""
	states := make([]*allocate.NodeState, 0, len(cands))
	byName := make(map[string]*nodeInventory, len(cands))
	sig := quickSignature(alt)
	for _, n := range cands {
		usage := sanitizeUsage(usageOf(n))
		if !mayFit(usage, alt) {
			// Planning it fails too, whatever its devices: skip the rest.
			continue
		}
		q := quickEligible(ctx, sel, n, alt, sig)
		if !q.uniform {
			return nil, false
		}
		if !q.any {
			continue
		}
		elig := q.elig
		if alt.Share {
			if req.Share == nil {
				req = allocate.Request{Share: q.share}
				shareKey = q.shareKey
			} else if q.shareKey != shareKey {
				return nil, false
			}
		}
		for pos := range usage {
			if !elig[pos] {
				usage[pos] = allocate.GPUUsage{Exclusive: true}
			}
		}
		states = append(states, &allocate.NodeState{Name: n.Node, Topology: n.Topo, Usage: usage,
			MaxSharesPerGPU: maxSharesPerGPU(alt), MemoryOvercommitPercent: memoryOvercommit(alt)})
		if _, dup := byName[n.Node]; dup {
			// choosePlan maps the allocator's answer back by name.
			return nil, false
		}
		byName[n.Node] = n
	}
	if len(states) == 0 {
		return nil, false
	}
	r, err := allocate.ChooseNode(states, req, pol)
	if err != nil {
		return nil, false
	}
	n := byName[r.Node]
	if n == nil {
		return nil, false
	}
	plan, _ := planNode(ctx, sel, pol, n, usageOf(n), pending)
	if plan == nil {
		return nil, false
	}
	return plan, true
}

// mayFit is a cheap necessary condition for the alternative to fit on a
// node with this (sanitized) usage: k GPUs free to be given out whole, or
// one GPU not given out whole for a share. Eligibility only removes GPUs.
func mayFit(usage []allocate.GPUUsage, alt *alternative) bool {
	free, open := 0, 0
	for _, u := range usage {
		if !u.Exclusive {
			open++
			if u.Shares == 0 {
				free++
			}
		}
	}
	if alt.Share {
		return open > 0
	}
	return free >= alt.Count
}

// quickElig is what quickChoice needs of one node for one alternative:
// the devices it may use (read-only) and, for a share, the one share size
// they all take. Memoised per node, since a node's inventory is immutable
// and selectors, taints and share sizes depend on nothing else.
type quickElig struct {
	elig []bool
	// any: some device qualifies; uniform: they all take one share size.
	any, uniform bool
	shareKey     string
	share        *allocate.ShareRequest
}

// quickSignature identifies what quickElig depends on in an alternative.
func quickSignature(alt *alternative) string {
	var b strings.Builder
	for _, s := range alt.Selectors {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, t := range alt.Tolerations {
		fmt.Fprintf(&b, "\x01%s/%s/%s/%s", t.Key, t.Operator, t.Value, t.Effect)
		if t.TolerationSeconds != nil {
			fmt.Fprintf(&b, "/%d", *t.TolerationSeconds)
		}
	}
	if alt.Share {
		b.WriteString("\x02share:" + alt.shareSig)
	}
	return b.String()
}

// quickEligible is baseEligible without the reasons, narrowed for a share
// as placer.variants does, memoised per node and signature.
func quickEligible(ctx context.Context, sel *selectorEvaluator, n *nodeInventory, alt *alternative, sig string) *quickElig {
	n.memoMu.Lock()
	if n.quickMemo == nil {
		n.quickMemo = newLRU[*quickElig](memoEntriesPerNode)
	}
	q, ok := n.quickMemo.get(sig)
	n.memoMu.Unlock()
	if ok {
		return q
	}
	elig, _, err := sel.eligibleBySelectors(ctx, n, alt.Selectors)
	if err != nil {
		// Not memoised: it may be the context's.
		return &quickElig{uniform: true}
	}
	q = &quickElig{elig: elig, uniform: true}
	for pos, d := range n.Devices {
		if !elig[pos] {
			continue
		}
		if _, bad := untoleratedTaint(d, alt.Tolerations); bad || (alt.Share && !d.AllowMultiple) {
			elig[pos] = false
			continue
		}
		if alt.Share {
			sc := n.shareCons(alt, pos)
			if sc.err != nil {
				elig[pos] = false
				continue
			}
			if !q.any {
				q.shareKey, q.share = sc.key, sc.share
			} else if sc.key != q.shareKey {
				q.uniform = false
			}
		}
		q.any = true
	}
	n.memoMu.Lock()
	n.quickMemo.put(sig, q)
	n.memoMu.Unlock()
	return q
}

// maxSampledAlternatives bounds the nodes planned after a quick choice to
// name alternatives in the allocation event.
const maxSampledAlternatives = 8

// sampleAlternatives plans other candidates, in order, until three fit or
// maxSampledAlternatives were tried, for the allocation event's note. It
// returns the chosen plan first, the reasons the others did not fit and
// how many candidates were not planned at all.
func sampleAlternatives(ctx context.Context, sel *selectorEvaluator, pol allocate.Policy, cands []*nodeInventory, usageOf func(*nodeInventory) []allocate.GPUUsage, pending []*interpretedClaim, chosen *nodePlan) (plans []*nodePlan, why []string, unexamined int) {
	plans = []*nodePlan{chosen}
	tried, seenChosen := 0, false
	for i, n := range cands {
		if n == chosen.Node {
			seenChosen = true
			continue
		}
		if tried == maxSampledAlternatives || len(plans) == 4 {
			left := len(cands) - i
			if !seenChosen {
				left--
			}
			return plans, why, left
		}
		tried++
		plan, reasons := planNode(ctx, sel, pol, n, usageOf(n), pending)
		if plan != nil {
			plans = append(plans, plan)
		} else {
			why = append(why, reasons...)
		}
	}
	return plans, why, 0
}

// exhaustivePlans plans every candidate node; used when quickChoice does
// not apply and by tests as the reference.
func exhaustivePlans(ctx context.Context, sel *selectorEvaluator, pol allocate.Policy, cands []*nodeInventory, usageOf func(*nodeInventory) []allocate.GPUUsage, pending []*interpretedClaim) (plans []*nodePlan, failed int, why []string) {
	for _, n := range cands {
		plan, reasons := planNode(ctx, sel, pol, n, usageOf(n), pending)
		if plan != nil {
			plans = append(plans, plan)
		} else {
			failed++
			why = append(why, reasons...)
		}
	}
	return plans, failed, why
}
