package planner

import (
	"cmp"
	"fmt"
	"slices"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpulink/gpulink/internal/sliceformat"
)

// ForeignDevice is a device another DRA driver publishes on a node (an
// RDMA NIC, say), kept so that a claim asking for gpulink GPUs and such
// devices together can be allocated whole (foreign_claims.go). Its CEL
// maps are the cached slice's own, not copies.
type ForeignDevice struct {
	Driver, Pool, Name string
	CEL                dracel.Device
	Taints             []resourceapi.DeviceTaint
}

// Key names the device in the ledger.
func (d *ForeignDevice) Key() DeviceKey {
	return DeviceKey{Driver: d.Driver, Pool: d.Pool, Device: d.Name}
}

// attr looks up an attribute by fully qualified name (short names are the
// publishing driver's).
func (d *ForeignDevice) attr(fq resourceapi.FullyQualifiedName) (resourceapi.DeviceAttribute, bool) {
	return sliceformat.Lookup(d.CEL.Attributes, d.Driver, fq)
}

// MaxForeignDevicesPerNode bounds the other drivers' devices kept per node:
// a node has a handful of NICs, and a publisher gone wrong must not grow
// the controller without bound. Beyond it a node's pools are dropped and
// the problem recorded (ForeignProblems).
const MaxForeignDevicesPerNode = 1024

// foreignPool names one pool of another driver.
type foreignPool struct{ driver, pool string }

// foreignInventory keeps other drivers' node-local slices and, per node,
// their devices of each pool's newest complete generation. Guarded by
// Inventory.mu; a node's device list is replaced, never changed, so that
// readers may keep it.
type foreignInventory struct {
	slices   map[string]*resourceapi.ResourceSlice
	byPool   map[foreignPool]map[string]*resourceapi.ResourceSlice
	devices  map[foreignPool][]*ForeignDevice
	poolNode map[foreignPool]string
	byNode   map[string]*ForeignNode
	problems map[foreignPool]foreignProblem
}

// foreignProblem is why a pool's devices are not used, and the node they
// would be on (for the waiting events of its pods).
type foreignProblem struct{ node, msg string }

// ForeignNode is a node's other drivers' devices, by name (then driver
// and pool), with the selector outcomes on them: a new value replaces it
// whenever its pools change, so the memo never outlives its devices.
type ForeignNode struct {
	Devices []*ForeignDevice
	// pools are the pools Devices are in, once each (ForeignGeneration).
	pools []foreignPool

	memoMu sync.Mutex
	// memo holds, per CEL expression, whether each device matches it
	// (k8s.io/dynamic-resource-allocation/cel), so that a decision does
	// not evaluate selectors on every node again. Bounded (LRU).
	memo *lru[[]bool]
}

func (f *foreignInventory) init() {
	if f.slices == nil {
		f.slices = map[string]*resourceapi.ResourceSlice{}
		f.byPool = map[foreignPool]map[string]*resourceapi.ResourceSlice{}
		f.devices = map[foreignPool][]*ForeignDevice{}
		f.poolNode = map[foreignPool]string{}
		f.byNode = map[string]*ForeignNode{}
		f.problems = map[foreignPool]foreignProblem{}
	}
}

// upsertForeign records another driver's slice. Slices that are not
// node-local (allNodes, a node selector, per-device node selection) are
// not kept: gpulink plans one node's devices, and a network-attached
// device's availability on the node is not its to judge.
func (inv *Inventory) upsertForeign(s *resourceapi.ResourceSlice) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	f := &inv.foreign
	f.init()
	old, had := f.slices[s.Name]
	if had && s.ResourceVersion != "" && old.ResourceVersion == s.ResourceVersion && old.UID == s.UID && sameDeviceTaints(old, s) {
		// As Upsert does for gpulink's slices: the informer's periodic
		// resync hands back the version stored, and rebuilding would
		// replace the node's ForeignNode, and with it its selector memo
		// and the slot counts kept for it (planner.Slots), on every node
		// at once each resync period.
		return
	}
	if had {
		f.forget(old)
		f.rebuild(poolOf(old))
	}
	if s.Spec.NodeName == nil || *s.Spec.NodeName == "" {
		return
	}
	f.slices[s.Name] = s
	k := poolOf(s)
	if f.byPool[k] == nil {
		f.byPool[k] = map[string]*resourceapi.ResourceSlice{}
	}
	f.byPool[k][s.Name] = s
	f.rebuild(k)
}

// removeForeign forgets another driver's slice.
func (inv *Inventory) removeForeign(s *resourceapi.ResourceSlice) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	f := &inv.foreign
	f.init()
	if old, ok := f.slices[s.Name]; ok {
		f.forget(old)
		f.rebuild(poolOf(old))
	}
}

func poolOf(s *resourceapi.ResourceSlice) foreignPool {
	return foreignPool{driver: s.Spec.Driver, pool: s.Spec.Pool.Name}
}

func (f *foreignInventory) forget(s *resourceapi.ResourceSlice) {
	delete(f.slices, s.Name)
	k := poolOf(s)
	delete(f.byPool[k], s.Name)
	if len(f.byPool[k]) == 0 {
		delete(f.byPool, k)
	}
}

// rebuild recomputes a pool's devices: those of its newest generation,
// when every slice of that generation is here (an incomplete pool may be
// mid-update, so none of it is used, as kube-scheduler's allocator does
// not use it either), and when they all name one node.
func (f *foreignInventory) rebuild(k foreignPool) {
	old := f.poolNode[k]
	delete(f.devices, k)
	delete(f.poolNode, k)
	delete(f.problems, k)
	defer func() {
		if old != "" {
			f.rebuildNode(old)
		}
		if n := f.poolNode[k]; n != "" && n != old {
			f.rebuildNode(n)
		}
	}()
	stored := f.byPool[k]
	if len(stored) == 0 {
		return
	}
	var gen int64
	for _, s := range stored {
		gen = max(gen, s.Spec.Pool.Generation)
	}
	var newest []*resourceapi.ResourceSlice
	for _, s := range stored {
		if s.Spec.Pool.Generation == gen {
			newest = append(newest, s)
		}
	}
	slices.SortFunc(newest, func(a, b *resourceapi.ResourceSlice) int { return cmp.Compare(a.Name, b.Name) })
	if int64(len(newest)) < newest[0].Spec.Pool.ResourceSliceCount {
		f.problems[k] = foreignProblem{*newest[0].Spec.NodeName, fmt.Sprintf("pool %s of driver %s: generation %d has %d of its %d slices", k.pool, k.driver, gen, len(newest), newest[0].Spec.Pool.ResourceSliceCount)}
		return
	}
	node := *newest[0].Spec.NodeName
	var devs []*ForeignDevice
	for _, s := range newest {
		if *s.Spec.NodeName != node {
			f.problems[k] = foreignProblem{node, fmt.Sprintf("pool %s of driver %s: slices %s and %s name nodes %s and %s", k.pool, k.driver, newest[0].Name, s.Name, node, *s.Spec.NodeName)}
			return
		}
		for i := range s.Spec.Devices {
			d := &s.Spec.Devices[i]
			devs = append(devs, &ForeignDevice{Driver: k.driver, Pool: k.pool, Name: d.Name, Taints: d.Taints,
				CEL: dracel.Device{Driver: k.driver, AllowMultipleAllocations: d.AllowMultipleAllocations, Attributes: d.Attributes, Capacity: d.Capacity}})
		}
	}
	f.devices[k] = devs
	f.poolNode[k] = node
}

// rebuildNode gathers a node's devices from its pools, by name (then
// driver and pool): the order foreign devices are chosen in.
func (f *foreignInventory) rebuildNode(node string) {
	var devs []*ForeignDevice
	var pools []foreignPool
	for k, n := range f.poolNode {
		if n == node && len(f.devices[k]) > 0 {
			devs = append(devs, f.devices[k]...)
			pools = append(pools, k)
		}
	}
	if len(devs) > MaxForeignDevicesPerNode {
		for _, k := range pools {
			f.problems[k] = foreignProblem{node, fmt.Sprintf("node %s: other drivers publish %d devices, more than the %d gpulink keeps per node", node, len(devs), MaxForeignDevicesPerNode)}
		}
		devs = nil
	}
	if len(devs) == 0 {
		delete(f.byNode, node)
		return
	}
	slices.SortFunc(devs, func(a, b *ForeignDevice) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Driver, b.Driver), cmp.Compare(a.Pool, b.Pool))
	})
	f.byNode[node] = &ForeignNode{Devices: devs, pools: pools, memo: newLRU[[]bool](memoEntriesPerNode)}
}

// Foreign returns the other drivers' devices on a node (nil when none);
// its devices must not be modified.
func (inv *Inventory) Foreign(node string) *ForeignNode {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return inv.foreign.byNode[node]
}

// ForeignProblems says why other drivers' pools are not used, by
// "driver/pool".
func (inv *Inventory) ForeignProblems() map[string]string {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	out := make(map[string]string, len(inv.foreign.problems))
	for k, v := range inv.foreign.problems {
		out[k.driver+"/"+k.pool] = v.msg
	}
	return out
}

// foreignProblemsOn says why other drivers' pools on a node are not used,
// sorted.
func (inv *Inventory) foreignProblemsOn(node string) []string {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	var out []string
	for _, v := range inv.foreign.problems {
		if v.node == node {
			out = append(out, v.msg)
		}
	}
	slices.Sort(out)
	return out
}
