package planner

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/controllertest"
)

// planEach plans every node once, on several goroutines at a time when
// there are enough nodes, and on the caller's alone for few.
func TestPlanEach(t *testing.T) {
	for _, tc := range []struct {
		workers, n int
		parallel   bool
	}{
		{workers: 4, n: 1000, parallel: true},
		{workers: 4, n: 2 * minNodesPerWorker, parallel: true},
		{workers: 4, n: 2*minNodesPerWorker - 1, parallel: false},
		{workers: 1, n: 1000, parallel: false},
		{workers: 8, n: 0, parallel: false},
	} {
		t.Run(fmt.Sprintf("workers=%d/n=%d", tc.workers, tc.n), func(t *testing.T) {
			calls := make([]atomic.Int32, tc.n)
			var running, most atomic.Int32
			// The first two pieces to start wait (a while) for each other:
			// with two workers they meet, with one the wait times out.
			var met sync.WaitGroup
			met.Add(2)
			var started atomic.Int32
			planEach(tc.workers, tc.n, func(j int) {
				now := running.Add(1)
				defer running.Add(-1)
				for {
					m := most.Load()
					if now <= m || most.CompareAndSwap(m, now) {
						break
					}
				}
				if started.Add(1) <= 2 {
					met.Done()
					waitTimeout(&met, time.Second)
				}
				calls[j].Add(1)
			})
			for j := range calls {
				if c := calls[j].Load(); c != 1 {
					t.Fatalf("node %d planned %d times, want once", j, c)
				}
			}
			if got := most.Load() > 1; got != tc.parallel {
				t.Fatalf("at most %d planned at once, want parallel %v", most.Load(), tc.parallel)
			}
		})
	}
}

// waitTimeout waits for wg at most d.
func waitTimeout(wg *sync.WaitGroup, d time.Duration) {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
	}
}

// Planning the nodes on several workers decides as one worker does: the
// same node and devices, the same plans, rejections and reasons for a
// GPU+NIC pod (chooseForeign), and the same counts of a gang's copies
// with the same first devices (Slots), over random changes of a cluster
// large enough for the work to be split. Run with -race it also shows
// that planning nodes at once shares nothing unguarded.
func TestParallelPlanningDecidesAsOneWorker(t *testing.T) {
	const nodes = 4 * minNodesPerWorker
	rng := rand.New(rand.NewPCG(5, 8))
	roots := []string{"pci0000:00", "pci0000:20", "pci0000:80", "pci0000:a0"}
	nics := make([][]controllertest.NIC, nodes)
	for i := range nics {
		for k := range rng.IntN(4) + 1 {
			nics[i] = append(nics[i], nic(fmt.Sprintf("nic-%d", k), roots[rng.IntN(len(roots))]))
		}
	}
	par, ip, inv := nicCluster(t, nics...)
	par.parallelism = 4
	one, err := New(Config{Inventory: inv, Ledger: par.ledger, Filter: par.filter, Selectors: par.sel, Parallelism: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "d", UID: "p-uid"}}
	pending := gpuNICShapes(t, ip)
	describe := describeDecision
	countSlots := func(p *Planner, claims []*Claim) string {
		var firsts []string
		out, ok := p.Slots(ctx, SlotRequest{Pod: pod, Pending: claims, Nodes: inv.All(), Max: 4,
			FirstForeign: func(node int, devices []DeviceKey, _ bool) { firsts = append(firsts, fmt.Sprint(node, devices)) }})
		return fmt.Sprint(ok, out, firsts)
	}
	placed, counted := 0, 0
	for step := range 12 {
		// GPUs held on a few nodes, NICs on others, some let go.
		for range 20 {
			n := inv.Node(fmt.Sprintf("n%d", rng.IntN(nodes)))
			var uses []DeviceUse
			for _, pos := range rng.Perm(len(n.Devices))[:rng.IntN(4)+1] {
				uses = append(uses, DeviceUse{Key: DeviceKey{Pool: n.Pool, Device: n.Devices[pos].Name}, Exclusive: true})
			}
			if f := inv.Foreign(n.Node); f != nil && rng.IntN(2) == 0 {
				uses = append(uses, DeviceUse{Key: f.Devices[rng.IntN(len(f.Devices))].Key(), Exclusive: true})
			}
			par.ledger.Assume(types.UID(fmt.Sprintf("s%d-%s", step, n.Node)), uses)
		}
		for _, claims := range pending {
			req := Request{Pod: pod, Pending: claims}
			got, want := describe(par.Decide(ctx, req)), describe(one.Decide(ctx, req))
			if got != want {
				t.Fatalf("step %d (claim %s): 4 workers decided %s, one worker %s", step, claims[0].Claim.Name, got, want)
			}
			if !strings.HasPrefix(got, "nothing") {
				placed++
			}
			gotSlots, wantSlots := countSlots(par, claims), countSlots(one, claims)
			if gotSlots != wantSlots {
				t.Fatalf("step %d (claim %s): 4 workers counted %s, one worker %s", step, claims[0].Claim.Name, gotSlots, wantSlots)
			}
			counted++
		}
	}
	if placed == 0 || counted == 0 {
		t.Fatalf("placed %d, counted %d: the test exercised nothing", placed, counted)
	}
}

// A negative parallelism is refused, naming the value; 0 is the default.
func TestParallelismConfig(t *testing.T) {
	cfg := Config{Inventory: NewInventory(), Ledger: NewLedger(), Filter: &NodeFilter{}, Selectors: NewSelectorEvaluator()}
	cfg.Parallelism = -1
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "parallelism") || !strings.Contains(err.Error(), "-1") {
		t.Fatalf("parallelism -1: got %v, want an error naming it", err)
	}
	cfg.Parallelism = 0
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if p.parallelism != DefaultParallelism() || p.parallelism < 1 || p.parallelism > maxDefaultParallelism {
		t.Fatalf("parallelism 0: %d workers, want the default %d", p.parallelism, DefaultParallelism())
	}
}
