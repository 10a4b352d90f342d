package planner

import (
	"context"
	"runtime"

	"k8s.io/client-go/util/workqueue"
)

// Planning nodes in parallel.
//
// The decisions that take no shortcut plan node after node: a pod that
// claims other drivers' devices beside its GPUs (chooseForeign), and a
// gang's counts of copies per node (Slots) on nodes whose kept count is
// stale. On 5,000 nodes that was 160-180 ms for one GPU+NIC pod and
// 240-350 ms for a cold aligned gang, all on one core while the others
// idled, and all under the decision lock that every other pod waits on.
// Planning one node reads shared state only (the inventory, the ledger,
// the selector memos, each behind its own lock) and writes to a placer
// of its own, so the nodes are planned by up to Parallelism workers; what
// the decision keeps or reports is then gathered in node order, so that a
// decision does not depend on which worker finished first.

// minNodesPerWorker is the fewest nodes to plan that one more worker is
// started for: a node plans in 10-40 µs, and a worker costs a goroutine
// and a share of the cache lines the others touch.
const minNodesPerWorker = 32

// planChunk is how many nodes a worker takes at once: nodes differ in
// cost (a node with nothing free fails at once), so workers take small
// chunks rather than one share each.
const planChunk = 8

// maxDefaultParallelism caps DefaultParallelism, as kube-scheduler's
// parallelism (16 by default) does: a controller on a large node without
// a CPU limit would otherwise start a worker per core, and past a few
// dozen the workers mostly wait for the ledger's lock, which every node
// planned takes.
const maxDefaultParallelism = 16

// DefaultParallelism is the workers a decision plans nodes with when the
// configuration says nothing: one per CPU the process may use (Go's
// GOMAXPROCS follows the container's CPU limit), at most
// maxDefaultParallelism.
func DefaultParallelism() int { return min(runtime.GOMAXPROCS(0), maxDefaultParallelism) }

// planEach calls plan(j) for j in [0, n), on up to workers goroutines
// (fewer for few nodes; the caller's own goroutine alone for one). plan
// must write only to what belongs to j.
func planEach(workers, n int, plan func(j int)) {
	workers = min(workers, n/minNodesPerWorker)
	if workers <= 1 {
		for j := range n {
			plan(j)
		}
		return
	}
	// Not the decision's context: a piece left out would read as a node
	// without room; plan checks the context itself and fails fast.
	workqueue.ParallelizeUntil(context.Background(), workers, n, plan, workqueue.WithChunkSize(planChunk))
}
