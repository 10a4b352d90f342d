package allocate

import (
	"errors"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// bruteForce evaluates the objective in doc.go by plain enumeration, with
// no tables and no pruning, as the reference for the exact search.
func bruteForce(n *NodeState, req Request, mix *SizeMix) (uint64, bool) {
	t := n.Topology
	free := freeMask(n)
	cand := free & eligibleMask(n, req)
	k := req.GPUs
	sizes := bruteSizes(mix, bits.OnesCount64(free)-k)
	top := bruteFuture(t, free, sizes)
	long := bits.OnesCount64(free) < memoMinFree && t.Len() <= exactMaxFree
	var best bruteCand
	found := false
	for s := cand; ; s = (s - 1) & cand {
		if bits.OnesCount64(s) == k {
			kk := setKey(t, s)
			if kk.qualifies(k, req.RequiredLink) {
				rest := free &^ s
				c := bruteCand{set: s, key: kk, fut: bruteFuture(t, rest, sizes), rest: setKey(t, rest).agg()}
				if long {
					c.long = bruteLongRun(t, fullMask(t.Len())&^s, mix)
				}
				for i, j := range sizes {
					w := uint64(mix.orDefault().w[j])
					c.kept += w * bruteCapacity(t, rest, j, top[i].link(), c.fut[i].weak() == top[i].weak())
					if c.fut[i] == top[i] {
						c.exact += w
					}
				}
				if !found || c.better(best) {
					best, found = c, true
				}
			}
		}
		if s == 0 {
			break
		}
	}
	return best.set, found
}

// bruteCapacity is doc.go's capacity: the number of size-j sets the
// components of rest at link class c hold, at least 1 when has.
func bruteCapacity(t *topology.Topology, rest uint64, j int, c topology.Link, has bool) uint64 {
	if !has {
		return 0
	}
	var n uint64
	for left := rest; left != 0; {
		comp := component(t, left, bits.TrailingZeros64(left), c)
		left &^= comp
		n += uint64(bits.OnesCount64(comp) / j)
	}
	return max(n, 1)
}

type bruteCand struct {
	set         uint64
	key         key
	kept, exact uint64
	fut         []key
	long        uint64
	rest        uint32
}

// bruteLongRun is doc.go's criterion 3d for u, the node's GPUs outside
// the set, by plain enumeration: per size j of the mix whose ideal class
// (best weakest link of a j-set of the idle node) is above the node's
// weakest link and has at most longRunMaxSets sets, w_j * 2^20 when u holds one, and per size j2
// w_j * w_j2 when u holds one of each with no GPU in common.
func bruteLongRun(t *topology.Topology, u uint64, mix *SizeMix) uint64 {
	all := fullMask(t.Len())
	floor := setKey(t, all).weak()
	ideal := map[int][]uint64{}
	for j := 2; j <= t.Len(); j++ {
		var best uint8
		for s := all; s != 0; s = (s - 1) & all {
			if bits.OnesCount64(s) == j {
				best = max(best, setKey(t, s).weak())
			}
		}
		for s := all; s != 0; s = (s - 1) & all {
			if bits.OnesCount64(s) == j && setKey(t, s).weak() == best {
				ideal[j] = append(ideal[j], s)
			}
		}
		if len(ideal[j]) > longRunMaxSets || best == floor {
			delete(ideal, j)
		}
	}
	w := mix.orDefault().w
	var v uint64
	for j1 := 2; j1 <= t.Len(); j1++ {
		in := 0
		for _, a := range ideal[j1] {
			if a&^u == 0 {
				in++
			}
		}
		if w[j1] == 0 || in == 0 {
			continue
		}
		v += uint64(w[j1]) << 20
		for j2 := 2; j2 <= t.Len(); j2++ {
			if w[j2] == 0 {
				continue
			}
		pairs:
			for _, a := range ideal[j1] {
				for _, b := range ideal[j2] {
					if a&^u == 0 && b&^u == 0 && a&b == 0 {
						v += uint64(w[j1]) * uint64(w[j2])
						break pairs
					}
				}
			}
		}
	}
	return v
}

// better is doc.go's order: 1 weakest link, 3a classes kept for the
// future, 2 aggregate, 3b qualities kept, 3c remaining qualities largest
// size first, 3d the long run, 4 aggregate of the rest, 5 lowest
// positions.
func (c bruteCand) better(b bruteCand) bool {
	switch {
	case c.key.weak() != b.key.weak():
		return c.key.weak() > b.key.weak()
	case c.kept != b.kept:
		return c.kept > b.kept
	case c.key.agg() != b.key.agg():
		return c.key.agg() > b.key.agg()
	case c.exact != b.exact:
		return c.exact > b.exact
	}
	for i := range c.fut {
		if c.fut[i] != b.fut[i] {
			return c.fut[i] > b.fut[i]
		}
	}
	if c.long != b.long {
		return c.long > b.long
	}
	if c.rest != b.rest {
		return c.rest > b.rest
	}
	return lowerPositions(c.set, b.set)
}

// bruteSizes lists the future sizes with a weight, 2..maxRest, largest
// first.
func bruteSizes(mix *SizeMix, maxRest int) []int {
	var sizes []int
	for j := min(maxRest, exactMaxFree); j >= 2; j-- {
		if mix.orDefault().w[j] > 0 {
			sizes = append(sizes, j)
		}
	}
	return sizes
}

// bruteFuture lists, for each size, the best quality of any subset of
// rest of that size.
func bruteFuture(t *topology.Topology, rest uint64, sizes []int) []key {
	out := make([]key, len(sizes))
	for i, j := range sizes {
		for s := rest; s != 0; s = (s - 1) & rest {
			if bits.OnesCount64(s) == j {
				out[i] = max(out[i], setKey(t, s))
			}
		}
	}
	return out
}

type liveAlloc struct {
	req Request
	res Result
}

// TestRandomChurn plays random allocate/release sequences on every
// topology and checks the invariants after every step.
func TestRandomChurn(t *testing.T) {
	topos := allTopologies(t)
	required := []topology.Link{topology.LinkNone, topology.LinkNone, topology.LinkNVLink, nv2, topology.LinkPIX, topology.LinkNODE}
	steps := 1000
	if testing.Short() {
		steps = 150
	}
	for ti, nt := range topos {
		t.Run(nt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ti)+1, 42))
			n := nt.topo.Len()
			node := nodeWith("node-a", nt.topo)
			node.MaxSharesPerGPU = 3
			var live []liveAlloc
			placed := 0
			defer func() {
				// Guard against a generator that only produces failures.
				if !t.Failed() && placed < steps/5 {
					t.Errorf("only %d of %d steps placed anything", placed, steps)
				}
			}()
			for step := range steps {
				if len(live) > 0 && rng.IntN(3) == 0 {
					i := rng.IntN(len(live))
					if err := node.Release(live[i].req, live[i].res); err != nil {
						t.Fatalf("step %d: release: %v", step, err)
					}
					live = append(live[:i], live[i+1:]...)
					checkInvariants(t, node, live)
					continue
				}
				req := randomRequest(rng, n, required)
				res, err := Allocate(node, req, Policy{GPU: []Strategy{Binpack, Spread}[rng.IntN(2)]})
				again, err2 := Allocate(node, req, Policy{GPU: Binpack})
				if req.Share == nil && (!reflect.DeepEqual(res, again) || (err == nil) != (err2 == nil)) {
					t.Fatalf("step %d: not deterministic: %v %v / %v %v", step, res, err, again, err2)
				}
				var ue *UnsatisfiableError
				if err != nil && !errors.As(err, &ue) {
					t.Fatalf("step %d: %+v: unexpected error %v", step, req, err)
				}
				if req.Share == nil && n <= 8 {
					want, ok := bruteForce(node, req, nil)
					if ok != (err == nil) || (ok && !reflect.DeepEqual(res.GPUs, positions(want))) {
						t.Fatalf("step %d: %+v: Allocate = %v, %v; brute force = %v, %t", step, req, res.GPUs, err, positions(want), ok)
					}
				}
				if err != nil {
					continue
				}
				checkResult(t, node, req, res)
				if err := node.Commit(req, res); err != nil {
					t.Fatalf("step %d: commit %+v: %v", step, res, err)
				}
				live = append(live, liveAlloc{req, res})
				placed++
				checkInvariants(t, node, live)
			}
		})
	}
}

func randomRequest(rng *rand.Rand, n int, required []topology.Link) Request {
	var req Request
	if rng.IntN(4) == 0 {
		req.Share = &ShareRequest{MemoryBytes: int64(1+rng.IntN(8)) * gib, Cores: int64(5 + rng.IntN(56))}
	} else {
		req.GPUs = 1 + rng.IntN(min(n, 1+rng.IntN(8)))
		req.RequiredLink = required[rng.IntN(len(required))]
	}
	if rng.IntN(5) == 0 {
		eligible := make([]bool, n)
		for p := range eligible {
			eligible[p] = rng.IntN(4) != 0
		}
		if rng.IntN(2) == 0 {
			req.Eligible = eligible
		} else {
			req.EligibleByNode = map[string][]bool{"node-a": eligible}
		}
	}
	return req
}

// checkResult verifies a placement before it is committed.
func checkResult(t *testing.T, node *NodeState, req Request, res Result) {
	t.Helper()
	for _, p := range res.GPUs {
		if eligibleMask(node, req)>>p&1 == 0 {
			t.Fatalf("%+v: GPU %d is not eligible", res, p)
		}
		if req.Share != nil {
			if why := node.shareFit(p, req.Share); why != fits {
				t.Fatalf("%+v: share does not fit GPU %d: %s", res, p, misfitWords[why])
			}
		} else if freeMask(node)>>p&1 == 0 {
			t.Fatalf("%+v: GPU %d is not free", res, p)
		}
	}
	if req.Share != nil {
		return
	}
	var set uint64
	for _, p := range res.GPUs {
		set |= 1 << p
	}
	kk := setKey(node.Topology, set)
	if res.WeakestLink != kk.link() || res.AggregateLink != int(kk.agg()) {
		t.Fatalf("%+v: reported links differ from the set's (%s, %d)", res, kk.link(), kk.agg())
	}
	if req.GPUs >= 2 && res.WeakestLink < req.RequiredLink {
		t.Fatalf("%+v: weakest link below required %s", res, req.RequiredLink)
	}
}

// checkInvariants verifies usage against the live allocations.
func checkInvariants(t *testing.T, node *NodeState, live []liveAlloc) {
	t.Helper()
	if err := node.Validate(); err != nil {
		t.Fatal(err)
	}
	want := make([]GPUUsage, node.Topology.Len())
	for _, a := range live {
		for _, p := range a.res.GPUs {
			if a.req.Share == nil {
				if want[p].Exclusive {
					t.Fatalf("GPU %d given out whole twice", p)
				}
				want[p].Exclusive = true
				continue
			}
			want[p].Shares++
			want[p].MemoryBytes += a.req.Share.MemoryBytes
			want[p].Cores += a.req.Share.Cores
		}
	}
	for p, w := range want {
		if w.Exclusive && w.Shares > 0 {
			t.Fatalf("GPU %d is both exclusive and shared", p)
		}
		if w.Shares > node.maxShares() || w.Cores > 100 || w.MemoryBytes > node.Topology.GPUs[p].MemoryBytes {
			t.Fatalf("GPU %d over capacity: %+v", p, w)
		}
		if node.usage(p) != w {
			t.Fatalf("GPU %d usage %+v, live allocations say %+v", p, node.usage(p), w)
		}
	}
}

// TestExactMatchesBruteForceExhaustively compares the exact search with
// brute force on every usage pattern of the small topologies, where rare
// patterns (like the one that leaves a single intact NVLink quad) are the
// ones the tie-break exists for.
func TestExactMatchesBruteForceExhaustively(t *testing.T) {
	for _, nt := range allTopologies(t) {
		n := nt.topo.Len()
		if n > 8 {
			continue
		}
		t.Run(nt.name, func(t *testing.T) {
			for used := uint64(0); used < 1<<n; used++ {
				node := nodeWith("node-a", nt.topo, positions(used)...)
				for k := 1; k <= min(4, n-bits.OnesCount64(used)); k++ {
					for _, req := range []Request{{GPUs: k}, {GPUs: k, RequiredLink: topology.LinkNVLink}} {
						res, err := Allocate(node, req, Policy{})
						want, ok := bruteForce(node, req, nil)
						if ok != (err == nil) || (ok && !reflect.DeepEqual(res.GPUs, positions(want))) {
							t.Fatalf("used %v, %+v: Allocate = %v, %v; brute force = %v, %t",
								positions(used), req, res.GPUs, err, positions(want), ok)
						}
					}
				}
			}
		})
	}
}

// TestBoundSearchMatchesTable checks the branch and bound used to score
// nodes against the exact table: same best quality, and on small nodes the
// lowest-position set of that quality.
func TestBoundSearchMatchesTable(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 9))
	required := []topology.Link{topology.LinkNone, topology.LinkNVLink, topology.LinkPIX, nv2, nv12}
	for _, nt := range allTopologies(t) {
		n := nt.topo.Len()
		t.Run(nt.name, func(t *testing.T) {
			sc := getScratch()
			defer putScratch(sc)
			for range 200 {
				free := rng.Uint64() & fullMask(n)
				for bits.OnesCount64(free) > exactMaxFree {
					free &= free - 1
				}
				cand := free
				if rng.IntN(3) == 0 {
					cand &= rng.Uint64()
				}
				if bits.OnesCount64(cand) == 0 {
					continue
				}
				k := 1 + rng.IntN(bits.OnesCount64(cand))
				req := required[rng.IntN(len(required))]
				got := boundSearch(nt.topo, cand, k, req)
				want := exactPick(sc, nt.topo, free, cand, k, req, true, nil)
				// The table's set is the tie-break's choice, which may give
				// up aggregate for the future (criterion 3a before 2): same
				// weakest link, no more aggregate than the best set.
				if got.found != want.found || got.key.weak() != want.key.weak() || got.key < want.key {
					t.Fatalf("free %v cand %v k %d required %s: bound search %v %s/%d, table %v %s/%d",
						positions(free), positions(cand), k, req, got.found, got.key.link(), got.key.agg(), want.found, want.key.link(), want.key.agg())
				}
				if got.found && setKey(nt.topo, got.set) != got.key {
					t.Fatalf("bound search reported %s/%d for %v", got.key.link(), got.key.agg(), positions(got.set))
				}
				if got.found && n <= 8 {
					for s := cand; s != 0; s = (s - 1) & cand {
						if bits.OnesCount64(s) == k && setKey(nt.topo, s) == got.key && lowerPositions(s, got.set) {
							t.Fatalf("bound search chose %v, %v is lower with the same quality", positions(got.set), positions(s))
						}
					}
				}
			}
		})
	}
}
