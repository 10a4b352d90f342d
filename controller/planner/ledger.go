package planner

import (
	"maps"
	"strconv"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/driver/allocate"
)

// DeviceKey names one device cluster-wide: a gpulink device (Driver "")
// or another driver's (foreign_inventory.go).
type DeviceKey struct {
	Pool, Device string
	Driver       string
}

// DeviceUse is what one allocation result takes from a device.
type DeviceUse struct {
	Key DeviceKey
	// Exclusive is true for a dedicated result (no shareID): the whole
	// device is taken, as kube-scheduler counts it too.
	Exclusive   bool
	MemoryBytes int64
	Cores       int64
	// Group is a share's sharing group (alternative.ShareGroup).
	Group string
}

// claimUse is everything one claim holds.
type claimUse struct {
	uses []DeviceUse
	// assumedRV is set while the claim's usage comes from our own write
	// rather than the informer: the informer's copy is ignored until it is
	// at least as new as this resourceVersion ("" = write in flight).
	assumed   bool
	assumedRV string
	// observed is the informer's latest view while the write was in
	// flight, applied when the write settles.
	observed   *claimUse
	observedRV string
}

// Ledger counts every allocated gpulink device from every claim, whoever
// allocated it, plus the allocations this controller has decided but the
// informer has not shown yet. Decisions read it under the decision lock,
// so informer lag can never make a device look free twice.
type Ledger struct {
	mu     sync.Mutex
	claims map[types.UID]*claimUse
	usage  map[DeviceKey]*devTotals
	// kept are deleted claims whose devices stay counted in claims and
	// usage because pods that reserved them may still run (keepForPods).
	kept map[types.UID]*KeptClaim
	// poolGen counts the usage changes of each pool's devices, so that a
	// decision can tell which nodes changed since it last scored them
	// (scoreCache). Entries are never deleted: a pool that comes back must
	// not reuse a generation it had.
	poolGen map[string]uint64
	// foreignGen counts the hold changes of each other driver's pool
	// (ForeignGeneration), for the slot counts of pods that take NICs
	// beside their GPUs (slotCache). Never deleted, as poolGen.
	foreignGen map[foreignPool]uint64
	// changed, when set, is told the pool of every gpulink device whose
	// usage changes (OnPoolChange).
	changed func(pool string)
	// changes lists the pools whose generation moved, in order (rankIndex).
	changes usageLog
}

// devTotals sums the holders of one device. Exclusive holders are counted,
// not flagged, so that releasing one of two (which only a double
// allocation by someone else produces) still leaves the device taken.
type devTotals struct {
	exclusive, shares int
	memory, cores     int64
	// groups counts the device's shares per sharing group ("" included).
	groups map[string]int
}

func (t *devTotals) gpuUsage() allocate.GPUUsage {
	if t == nil {
		return allocate.GPUUsage{}
	}
	u := allocate.GPUUsage{Exclusive: t.exclusive > 0, Shares: t.shares, MemoryBytes: t.memory, Cores: t.cores}
	if t.shares > 0 {
		u.Group = t.group()
	}
	return u
}

// group is the sharing group of the device's shares: MixedShareGroups
// when they belong to several (only allocations made elsewhere, e.g. by
// kube-scheduler for a tolerating claim, produce that).
func (t *devTotals) group() string {
	if len(t.groups) > 1 {
		return allocate.MixedShareGroups
	}
	for g := range t.groups {
		return g
	}
	return ""
}

// countGroup adds sign shares of group g.
func (t *devTotals) countGroup(g string, sign int) {
	if t.groups == nil {
		t.groups = map[string]int{}
	}
	if t.groups[g] += sign; t.groups[g] == 0 {
		delete(t.groups, g)
	}
	if len(t.groups) == 0 {
		t.groups = nil
	}
}

// OnPoolChange has f told the pool (named after its node) whose gpulink
// devices' usage changes, once per pool and change, under the ledger's lock: f must be
// quick and must not call the ledger (a workqueue's Add). Set it before
// the ledger is used.
func (l *Ledger) OnPoolChange(f func(pool string)) { l.changed = f }

func NewLedger() *Ledger {
	return &Ledger{claims: map[types.UID]*claimUse{}, usage: map[DeviceKey]*devTotals{}, kept: map[types.UID]*KeptClaim{}, poolGen: map[string]uint64{}, foreignGen: map[foreignPool]uint64{}}
}

func (l *Ledger) addLocked(uses []DeviceUse, sign int) {
	logged := ""
	for _, u := range uses {
		if u.Key.Driver == "" {
			l.poolGen[u.Key.Pool]++
			// Once per pool and call: the claim's devices are on one node.
			if u.Key.Pool != logged {
				l.changes.add(u.Key.Pool)
				logged = u.Key.Pool
				if l.changed != nil {
					l.changed(u.Key.Pool)
				}
			}
		} else {
			l.foreignGen[foreignPool{driver: u.Key.Driver, pool: u.Key.Pool}]++
		}
		t := l.usage[u.Key]
		if t == nil {
			t = &devTotals{}
			l.usage[u.Key] = t
		}
		if u.Exclusive {
			t.exclusive += sign
		} else {
			t.shares += sign
			t.memory += int64(sign) * u.MemoryBytes
			t.cores += int64(sign) * u.Cores
			t.countGroup(u.Group, sign)
		}
		if t.exclusive == 0 && t.shares == 0 && t.memory == 0 && t.cores == 0 && t.groups == nil {
			delete(l.usage, u.Key)
		}
	}
}

// setLocked replaces the usage recorded for a claim.
func (l *Ledger) setLocked(uid types.UID, c *claimUse) {
	if old, ok := l.claims[uid]; ok {
		delete(l.claims, uid)
		l.addLocked(old.uses, -1)
	}
	if c != nil && (len(c.uses) > 0 || c.assumed) {
		l.claims[uid] = c
		l.addLocked(c.uses, 1)
	}
}

// Observe records the informer's view of a claim. The view is ignored while
// an assumed allocation of ours is newer than it.
func (l *Ledger) Observe(claim *resourceapi.ResourceClaim) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if old, ok := l.claims[claim.UID]; ok && old.assumed {
		if old.assumedRV == "" {
			// Our write is in flight; the informer may already deliver
			// its result before the write returns. Keep the newest view
			// for settle to compare.
			old.observed = &claimUse{uses: UsesOf(claim)}
			old.observedRV = claim.ResourceVersion
			return
		}
		if !ResourceVersionAtLeast(claim.ResourceVersion, old.assumedRV) {
			return
		}
	}
	l.setLocked(claim.UID, &claimUse{uses: UsesOf(claim)})
}

// Forget drops a deleted claim.
func (l *Ledger) Forget(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setLocked(uid, nil)
	delete(l.kept, uid)
}

// Assume records an allocation about to be written. It returns a function
// that settles the assumption: with the resourceVersion the write returned,
// or with "" after a failed write, which restores the previous usage.
//
// A claim is decided once: assume refuses (false, and changes nothing)
// when the claim already holds devices, assumed by another decision whose
// write is in flight or not yet observed, or allocated as the informer
// shows it. Replacing such an entry would make the first decision's
// devices look free while they are being written.
func (l *Ledger) Assume(uid types.UID, uses []DeviceUse) (func(rv string, ok bool), bool) {
	l.mu.Lock()
	if _, held := l.claims[uid]; held {
		l.mu.Unlock()
		return nil, false
	}
	mine := &claimUse{uses: uses, assumed: true}
	l.setLocked(uid, mine)
	l.mu.Unlock()
	return func(rv string, ok bool) {
		l.mu.Lock()
		defer l.mu.Unlock()
		cur := l.claims[uid]
		if cur != mine || cur.assumedRV != "" {
			// The claim was deleted or observed meanwhile, or this
			// assumption was settled already.
			return
		}
		switch {
		case ok && cur.observed != nil && ResourceVersionAtLeast(cur.observedRV, rv):
			// The informer already showed our write (or something newer).
			l.setLocked(uid, cur.observed)
		case ok:
			cur.assumedRV = rv
		case cur.observed != nil:
			l.setLocked(uid, cur.observed)
		default:
			l.setLocked(uid, nil)
		}
	}, true
}

// Held tells whether the claim holds devices in the ledger: assumed by a
// decision of ours or allocated as the informer shows it.
func (l *Ledger) Held(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.claims[uid]
	return ok
}

// UsageOf returns a copy of the usage of one device.
func (l *Ledger) UsageOf(key DeviceKey) allocate.GPUUsage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.usage[key].gpuUsage()
}

// NodeUsage returns the usage of a node's devices in topology order.
func (l *Ledger) NodeUsage(n *NodeInventory) []allocate.GPUUsage {
	out := make([]allocate.GPUUsage, len(n.Devices))
	l.mu.Lock()
	defer l.mu.Unlock()
	for p, d := range n.Devices {
		out[p] = l.usage[DeviceKey{Pool: n.Pool, Device: d.Name}].gpuUsage()
	}
	return out
}

// Touch counts a change of what decisions rank a pool's node by besides
// its device usage (its CPU and memory left, with ranking by stranding),
// so that scores kept for it are computed again.
func (l *Ledger) Touch(pool string) {
	l.mu.Lock()
	l.poolGen[pool]++
	l.changes.add(pool)
	l.mu.Unlock()
}

// Generations sets out[i] to the usage generation of nodes[i]'s pool and
// returns the count of generation changes they include (Changes).
func (l *Ledger) Generations(nodes []*NodeInventory, out []uint64) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, n := range nodes {
		out[i] = l.poolGen[n.Pool]
	}
	return l.changes.seq
}

// Changes appends to out the pools whose usage generation moved after the
// first since changes (in order, a pool once per change), and returns the
// count of changes now; ok is false when the ledger no longer keeps them
// all, and the caller then reads every node's generation (Generations).
func (l *Ledger) Changes(since uint64, out []string) (_ []string, now uint64, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.changes.since(since, out)
}

// ResourceVersionAtLeast tells whether have is at least want.
// resourceVersions are opaque by contract but etcd-backed servers issue
// increasing integers; anything unparsable counts as newer, so that the
// informer's view wins.
func ResourceVersionAtLeast(have, want string) bool {
	h, err1 := strconv.ParseUint(have, 10, 64)
	w, err2 := strconv.ParseUint(want, 10, 64)
	return err1 != nil || err2 != nil || h >= w
}

// InFlight tells whether our own allocation of the claim has not been
// seen by the informer yet (written or being written).
func (l *Ledger) InFlight(uid types.UID) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	c, ok := l.claims[uid]
	return ok && c.assumed
}

// KeptClaim is a deleted claim whose devices stay counted while pods that
// reserved it may still run: a pod keeps using its GPUs when its claim is
// deleted under it (the kubelet does not stop running containers), so
// handing them to the next claim would give one GPU to two tenants.
type KeptClaim struct {
	Namespace, Name string
	// Allocation is the claim's last seen allocation, for the hold record.
	Allocation *resourceapi.AllocationResult
	// Pods are the reserving pods (UID -> name, in Namespace) that may
	// still use the devices.
	Pods map[types.UID]string
	// Recorded is set once a hold record (holds.go) was written for it.
	Recorded bool
}

// KeepForPods drops a deleted claim but keeps counting its gpulink devices
// (whole GPUs and shares' consumed capacity, from the claim's last seen
// allocation) for pods, the reserving pods that may still use them. It
// reports whether anything is kept: nothing is when the claim held no
// gpulink device or no pod is named, and the claim is then forgotten.
func (l *Ledger) KeepForPods(claim *resourceapi.ResourceClaim, pods map[types.UID]string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	uses := UsesOf(claim)
	if !holdsGpulink(uses) || len(pods) == 0 {
		l.setLocked(claim.UID, nil)
		delete(l.kept, claim.UID)
		return false
	}
	// The deleted object is the newest view: an assumption of ours still
	// in flight for it can only fail now (the claim is gone).
	l.setLocked(claim.UID, &claimUse{uses: uses})
	l.kept[claim.UID] = &KeptClaim{
		Namespace:  claim.Namespace,
		Name:       claim.Name,
		Allocation: claim.Status.Allocation.DeepCopy(),
		Pods:       maps.Clone(pods),
	}
	return true
}

// KeptClaim returns a copy of a kept claim.
func (l *Ledger) KeptClaim(uid types.UID) (KeptClaim, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	k, ok := l.kept[uid]
	if !ok {
		return KeptClaim{}, false
	}
	out := *k
	out.Pods = maps.Clone(k.Pods)
	return out, true
}

// KeptPodEnded removes a pod from the pods a kept claim is counted for
// (claim "" for every kept claim) and releases the claims no pod is left
// for. It returns those, each with whether it had a hold record (whose
// deletion is then counted as the release).
func (l *Ledger) KeptPodEnded(claim, pod types.UID) map[types.UID]bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var released map[types.UID]bool
	for uid, k := range l.kept {
		if claim != "" && uid != claim {
			continue
		}
		if _, ok := k.Pods[pod]; !ok {
			continue
		}
		delete(k.Pods, pod)
		if len(k.Pods) == 0 {
			delete(l.kept, uid)
			l.setLocked(uid, nil)
			if released == nil {
				released = map[types.UID]bool{}
			}
			released[uid] = k.Recorded
		}
	}
	return released
}

// MarkRecorded notes that a kept claim's hold record was written.
func (l *Ledger) MarkRecorded(uid types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if k, ok := l.kept[uid]; ok {
		k.Recorded = true
	}
}

// ObserveRecord counts a hold record (a claim in the hold namespace that
// stands for a deleted claim, holds.go) like any claim, with uses taken
// from its allocation or, while that is not written yet, from its
// annotation. Once the record counts devices, the in-memory kept claim it
// stands for is dropped in the same step, so the devices are never
// uncounted in between (and counted twice only while both exist).
func (l *Ledger) ObserveRecord(rec *resourceapi.ResourceClaim, uses []DeviceUse, keptUID types.UID) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setLocked(rec.UID, &claimUse{uses: uses})
	if _, ok := l.kept[keptUID]; ok && len(uses) > 0 {
		delete(l.kept, keptUID)
		l.setLocked(keptUID, nil)
	}
}
