package allocate

import (
	"errors"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"reflect"
	"testing"

	"github.com/gpulink/gpulink/driver/topology"
)

// When the eligible free GPUs are exactly as many as asked for,
// allocateWhole answers without the search (forcedWhole), and its answer
// is the search's: the same GPUs, link classes and, when the set's links
// fall short, the same reason. Over every topology, random GPUs busy,
// sizes, required links and size mixes.
func TestForcedWholeMatchesSearch(t *testing.T) {
	required := []topology.Link{topology.LinkNone, topology.LinkNVLink, nv2, topology.LinkPIX, topology.LinkNODE, topology.LinkSYS}
	mixes := []*SizeMix{nil, DefaultSizeMix}
	for ti, nt := range allTopologies(t) {
		t.Run(nt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(uint64(ti)+7, 19))
			n := nt.topo.Len()
			found, short := 0, 0
			for step := range 300 {
				var busy []int
				for p := range n {
					if rng.IntN(3) == 0 {
						busy = append(busy, p)
					}
				}
				node := nodeWith("node-a", nt.topo, busy...)
				free := freeMask(node)
				nf := bits.OnesCount64(free)
				if nf == 0 {
					continue
				}
				// k of the free GPUs eligible, the others not.
				k := 1 + rng.IntN(min(nf, 8))
				var cand uint64
				for _, p := range rng.Perm(n) {
					if bits.OnesCount64(cand) == k {
						break
					}
					if free>>p&1 == 1 {
						cand |= 1 << p
					}
				}
				eligible := make([]bool, n)
				for p := range n {
					eligible[p] = cand>>p&1 == 1 || free>>p&1 == 0
				}
				req := Request{GPUs: k, RequiredLink: required[rng.IntN(len(required))], Eligible: eligible}
				mix := mixes[rng.IntN(len(mixes))]
				got, err := allocateWhole(node, req, mix)

				sc := getScratch()
				want := pickWhole(sc, node.Topology, free, cand, k, req.RequiredLink, true, mix)
				putScratch(sc)
				if !want.found {
					var ue *UnsatisfiableError
					reason := fmt.Sprintf("no %d free GPUs with %s on %s (best free set of %d: weakest link %s)", k, linkPhrase(req.RequiredLink), nodeLabel("node-a"), k, want.bestAny.link())
					if !errors.As(err, &ue) || ue.Reason != reason {
						t.Fatalf("step %d: %d GPUs of %b, required %s: got %v, %v; the search finds none", step, k, cand, req.RequiredLink, got, err)
					}
					short++
					continue
				}
				if err != nil || !reflect.DeepEqual(got, wholeResult("node-a", want)) {
					t.Fatalf("step %d: %d GPUs of %b, required %s: got %+v, %v; the search %+v", step, k, cand, req.RequiredLink, got, err, wholeResult("node-a", want))
				}
				found++
			}
			if found == 0 {
				t.Fatalf("no forced set was found (%d short): the test compared nothing", short)
			}
		})
	}
}
