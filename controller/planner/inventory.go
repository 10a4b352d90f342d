package planner

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	dracel "k8s.io/dynamic-resource-allocation/cel"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// DeviceInfo is one gpulink device as a ResourceSlice publishes it.
type DeviceInfo struct {
	Name  string
	Index int
	// Pos is the device's position in the node's topology.
	Pos int
	// CEL is the input for selector evaluation.
	CEL dracel.Device
	// Attributes and capacities are looked up in CEL's maps, which are the
	// slice's own (shared with the informer's copy), by fully qualified
	// name with attr and capacity: a copy under qualified names took most
	// of the inventory's memory per node.
	Taints        []resourceapi.DeviceTaint
	AllowMultiple bool
}

// NodeInventory is the immutable view of one node's gpulink pool. A new
// value replaces it whenever the pool's slices change, so readers may keep
// a reference without locking; only the selector memo is mutable, and it
// guards itself.
type NodeInventory struct {
	Node string
	// TieKey orders the node among nodes of equal score (tie): its place
	// in the cluster's topology hierarchy, then its name
	// (allocate.TopologyTieKey, Inventory.SetTieKey); empty: the name.
	TieKey string
	Pool   string
	Topo   *topology.Topology
	// Devices is indexed by topology position.
	Devices []*DeviceInfo
	// unavailable are the positions of the GPUs no pod can be given
	// (unavailableGPUs), found once per slice change: the scarcity
	// weighing reads every node's.
	unavailable []int
	byName      map[string]*DeviceInfo
	// MIG are the node's MIG devices, in slice order (inventory_mig.go).
	MIG []*migDevice
	// OnDemand are the node's GPUs partitioned on demand, by index; their
	// partitions are in MIG (inventory_ondemand.go).
	OnDemand []*onDemandGPU

	memoMu sync.Mutex
	// memo caches selector results per expression and position: selectors
	// are evaluated once per device, not once per claim. Bounded (LRU).
	memo *lru[[]selectorOutcome]
	// shareMemo caches share consumption per share signature and position.
	// Bounded (LRU).
	shareMemo *lru[[]*shareCons]
	// quickMemo caches quickChoice's view of the node per alternative
	// signature (see quickEligible); created on first use. Bounded (LRU).
	quickMemo *lru[*quickElig]
	// attrMemo caches each device's value of the attributes claims
	// constrain (attrValues); created on first use. Bounded (LRU).
	attrMemo *lru[[]attrValue]

	// clique is Clique, found once when the node is built (cliqueKnown).
	clique      string
	cliqueKnown bool

	bestMu sync.Mutex
	// best caches bestLink by set size.
	best map[int]topology.Link
	// idle caches idleBest by set size.
	idle map[int][]topology.Link
}

type selectorOutcome struct {
	match bool
	err   error
}

// qualify returns the fully qualified form of an attribute or capacity name;
// names without a domain belong to the driver that publishes them.
func qualify(name string, domain string) resourceapi.FullyQualifiedName {
	if strings.Contains(name, "/") {
		return resourceapi.FullyQualifiedName(name)
	}
	return resourceapi.FullyQualifiedName(domain + "/" + name)
}

// attr returns the device's attribute of a fully qualified name; in the
// slice, the driver's own attributes may also go by their short names.
func (d *DeviceInfo) attr(fq resourceapi.FullyQualifiedName) (resourceapi.DeviceAttribute, bool) {
	return sliceformat.Lookup(d.CEL.Attributes, d.CEL.Driver, fq)
}

// capacity is attr for capacities.
func (d *DeviceInfo) capacity(fq resourceapi.FullyQualifiedName) (resourceapi.DeviceCapacity, bool) {
	return sliceformat.Lookup(d.CEL.Capacity, d.CEL.Driver, fq)
}

var (
	capMemory = qualify(driver.CapacityMemory, driver.Name)
	capCores  = qualify(driver.CapacityCores, driver.Name)
)

// Inventory turns gpulink's ResourceSlices into per-node topologies. It is
// fed by the ResourceSlice informer and safe for concurrent use.
type Inventory struct {
	mu     sync.RWMutex
	Slices map[string]*resourceapi.ResourceSlice // by slice name
	// ByPool indexes slices by pool and slice name, so that rebuilding a
	// pool reads only its own slices: scanning all of slices made
	// publishing N nodes cost O(N^2). Kept in step with slices by
	// storeLocked and forgetLocked, its only writers.
	ByPool   map[string]map[string]*resourceapi.ResourceSlice
	nodes    map[string]*NodeInventory // by node name
	poolNode map[string]string         // pool -> node it was built for
	// sorted caches all()'s answer until a node changes; read-only.
	sorted []*NodeInventory
	// gen counts rebuilds of pools, so that what is derived from the node
	// set (productAdmission's representatives) knows when to derive it
	// again.
	gen      uint64
	problems map[string]string // pool -> why it is unusable
	// foreign keeps other drivers' devices per node (foreign_inventory.go).
	foreign foreignInventory
	// tieKeys are the nodes' tie keys by node name (SetTieKey), kept
	// for nodes whose slices come later.
	tieKeys map[string]string
}

func NewInventory() *Inventory {
	return &Inventory{
		Slices:   map[string]*resourceapi.ResourceSlice{},
		ByPool:   map[string]map[string]*resourceapi.ResourceSlice{},
		nodes:    map[string]*NodeInventory{},
		poolNode: map[string]string{},
		problems: map[string]string{},
		tieKeys:  map[string]string{},
	}
}

// SetTieKey sets the tie key of node name (NodeInventory.TieKey; ""
// forgets it). A node already built is built again with it, as when its
// slices change, so that the decisions' rankings, which keep a node list
// until one of its nodes is replaced, order it anew.
func (inv *Inventory) SetTieKey(name, key string) {
	inv.mu.Lock()
	defer inv.mu.Unlock()
	if inv.tieKeys[name] == key {
		return
	}
	if key == "" {
		delete(inv.tieKeys, name)
	} else {
		inv.tieKeys[name] = key
	}
	n, ok := inv.nodes[name]
	if !ok || n.TieKey == key {
		return
	}
	// An error leaves the pool's problem recorded, as Upsert does.
	_ = inv.rebuildLocked(n.Pool)
}

// tieKeyOf returns the tie key SetTieKey set for node name, built or not
// ("": none).
func (inv *Inventory) tieKeyOf(name string) string {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return inv.tieKeys[name]
}

// tie is the key the node is ordered by among nodes of equal score.
func (n *NodeInventory) tie() string {
	if n.TieKey != "" {
		return n.TieKey
	}
	return n.Node
}

// Upsert records a slice and rebuilds its pool. It returns the problem that
// makes the pool unusable, if any. Slices of other drivers are kept
// apart, for claims that ask for their devices with gpulink's.
func (inv *Inventory) Upsert(slice *resourceapi.ResourceSlice) error {
	if slice.Spec.Driver != driver.Name {
		inv.upsertForeign(slice)
		return nil
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	old, had := inv.Slices[slice.Name]
	if had && slice.ResourceVersion != "" && old.ResourceVersion == slice.ResourceVersion && old.UID == slice.UID && sameDeviceTaints(old, slice) {
		// The informer's periodic resync hands back the version stored:
		// rebuilding the pool would replace the node's inventory, and
		// with it every memo and kept score of the node, on every node
		// at once each resync period (at 5,000 nodes: every selector
		// evaluated again and every request shape's ranking rebuilt).
		// The taints are compared too: the ResourceSlice tracker applies
		// DeviceTaintRules to a slice without changing its version.
		if p, bad := inv.problems[slice.Spec.Pool.Name]; bad {
			return errors.New(p)
		}
		return nil
	}
	if err := sliceformat.CheckPoolNode(slice); err != nil {
		// Not even stored: a stored slice would take part in its pool's
		// newest-generation-wins rebuild. An earlier, acceptable version
		// of it goes, and its pool is rebuilt without it.
		if had {
			inv.forgetLocked(old)
			_ = inv.rebuildLocked(old.Spec.Pool.Name)
		}
		return err
	}
	if had && old.Spec.Pool.Name != slice.Spec.Pool.Name {
		inv.forgetLocked(old)
		// The slice moved pools. A problem with what is left of the old
		// pool is recorded in inv.problems; the caller only reports on
		// the pool the slice is in now.
		_ = inv.rebuildLocked(old.Spec.Pool.Name)
	}
	inv.storeLocked(slice)
	return inv.rebuildLocked(slice.Spec.Pool.Name)
}

// storeLocked records a slice under its name and in its pool's index,
// replacing a stored slice of the same name in the same pool (a slice
// that moves pools is forgotten first).
func (inv *Inventory) storeLocked(slice *resourceapi.ResourceSlice) {
	inv.Slices[slice.Name] = slice
	pool := inv.ByPool[slice.Spec.Pool.Name]
	if pool == nil {
		pool = map[string]*resourceapi.ResourceSlice{}
		inv.ByPool[slice.Spec.Pool.Name] = pool
	}
	pool[slice.Name] = slice
}

// forgetLocked drops a stored slice, given as stored (its pool is the
// stored version's), from slices and from its pool's index.
func (inv *Inventory) forgetLocked(stored *resourceapi.ResourceSlice) {
	delete(inv.Slices, stored.Name)
	if pool := inv.ByPool[stored.Spec.Pool.Name]; pool != nil {
		delete(pool, stored.Name)
		if len(pool) == 0 {
			delete(inv.ByPool, stored.Spec.Pool.Name)
		}
	}
}

// Remove forgets a slice and rebuilds its pool.
func (inv *Inventory) Remove(slice *resourceapi.ResourceSlice) {
	if slice.Spec.Driver != driver.Name {
		inv.removeForeign(slice)
		return
	}
	inv.mu.Lock()
	defer inv.mu.Unlock()
	pool := slice.Spec.Pool.Name
	if stored, ok := inv.Slices[slice.Name]; ok {
		// The pool of the version that was accepted, should the deleted
		// object carry another.
		pool = stored.Spec.Pool.Name
		inv.forgetLocked(stored)
	} else if sliceformat.CheckPoolNode(slice) != nil {
		// Never stored, so nothing to rebuild.
		return
	}
	_ = inv.rebuildLocked(pool)
}

// Node returns the inventory of a node, or nil when it has no usable pool.
func (inv *Inventory) Node(name string) *NodeInventory {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return inv.nodes[name]
}

// Len counts the usable node inventories.
func (inv *Inventory) Len() int {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return len(inv.nodes)
}

// All returns every usable node inventory, sorted by node name.
func (inv *Inventory) All() []*NodeInventory {
	return slices.Clone(inv.sortedNodes())
}

// sortedNodes is All without the copy: the inventory's own list, which it
// replaces and never changes when a node changes. Callers must not modify
// it; a decision reads it whole, and a copy of 5,000 pointers per decision
// was a tenth of the controller's allocations in make scale.
func (inv *Inventory) sortedNodes() []*NodeInventory {
	inv.mu.RLock()
	sorted := inv.sorted
	inv.mu.RUnlock()
	if sorted == nil {
		// Sorted once per change of the node set, not once per decision.
		inv.mu.Lock()
		if inv.sorted == nil {
			out := make([]*NodeInventory, 0, len(inv.nodes))
			for _, n := range inv.nodes {
				out = append(out, n)
			}
			sort.Slice(out, func(i, j int) bool { return out[i].Node < out[j].Node })
			inv.sorted = out
		}
		sorted = inv.sorted
		inv.mu.Unlock()
	}
	return sorted
}

// Generation changes whenever a node's inventory is rebuilt or dropped.
func (inv *Inventory) Generation() uint64 {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	return inv.gen
}

// ProblemsSnapshot returns why pools are unusable, by pool name.
func (inv *Inventory) ProblemsSnapshot() map[string]string {
	inv.mu.RLock()
	defer inv.mu.RUnlock()
	out := make(map[string]string, len(inv.problems))
	for k, v := range inv.problems {
		out[k] = v
	}
	return out
}

func (inv *Inventory) rebuildLocked(pool string) error {
	inv.sorted = nil
	inv.gen++
	if old, ok := inv.poolNode[pool]; ok {
		delete(inv.nodes, old)
		delete(inv.poolNode, pool)
	}
	delete(inv.problems, pool)
	stored := inv.ByPool[pool]
	if len(stored) == 0 {
		return nil
	}
	slices := make([]*resourceapi.ResourceSlice, 0, len(stored))
	for _, s := range stored {
		slices = append(slices, s)
	}
	n, err := buildNode(pool, slices)
	if err != nil {
		inv.problems[pool] = err.Error()
		return err
	}
	n.TieKey = inv.tieKeys[n.Node]
	inv.nodes[n.Node] = n
	inv.poolNode[pool] = n.Node
	return nil
}

// buildNode builds a node from the slices of one pool, decoded by
// sliceformat (the newest generation, complete and node-local).
func buildNode(pool string, slices []*resourceapi.ResourceSlice) (*NodeInventory, error) {
	decoded, err := sliceformat.DecodePool(pool, slices)
	if err != nil {
		return nil, err
	}
	topo := decoded.Topology
	// Outside any decision: the first decision on a node of a new kind
	// (12-16 GPUs) then costs what later ones do.
	allocate.Prepare(topo)
	n := &NodeInventory{
		Node:      decoded.Node,
		Pool:      pool,
		Topo:      topo,
		Devices:   make([]*DeviceInfo, topo.Len()),
		byName:    make(map[string]*DeviceInfo, topo.Len()),
		memo:      newLRU[[]selectorOutcome](memoEntriesPerNode),
		shareMemo: newLRU[[]*shareCons](memoEntriesPerNode),
	}
	for p, g := range decoded.GPUs {
		d := newDeviceInfo(g)
		n.Devices[p] = d
		n.byName[d.Name] = d
	}
	n.unavailable = unavailableGPUs(n.Devices)
	for _, m := range decoded.MIG {
		n.MIG = append(n.MIG, newMIGDevice(m))
	}
	if err := n.addOnDemand(decoded.OnDemand); err != nil {
		return nil, fmt.Errorf("pool %q: %w", pool, err)
	}
	n.clique, n.cliqueKnown = n.findClique(), true
	return n, nil
}

// newDeviceInfo keeps what decisions read of a decoded GPU; its CEL maps
// are the slice's own.
func newDeviceInfo(g sliceformat.GPU) *DeviceInfo {
	dev := g.Device
	return &DeviceInfo{
		Name:          dev.Name,
		Index:         g.Index,
		Pos:           g.Pos,
		Taints:        dev.Taints,
		AllowMultiple: dev.AllowMultipleAllocations != nil && *dev.AllowMultipleAllocations,
		CEL:           celDevice(dev),
	}
}

// celDevice is a published device as selectors see it, with the slice's
// own attribute and capacity maps.
func celDevice(dev *resourceapi.Device) dracel.Device {
	return dracel.Device{
		Driver:                   driver.Name,
		AllowMultipleAllocations: dev.AllowMultipleAllocations,
		Attributes:               dev.Attributes,
		Capacity:                 dev.Capacity,
	}
}

// attrKey returns a comparable form of a scalar attribute value, or false
// for list values and unset attributes, which matchAttribute cannot use.
func attrKey(a resourceapi.DeviceAttribute) (string, bool) {
	switch {
	case a.IntValue != nil:
		return "i:" + fmt.Sprint(*a.IntValue), true
	case a.BoolValue != nil:
		return "b:" + fmt.Sprint(*a.BoolValue), true
	case a.StringValue != nil:
		return "s:" + *a.StringValue, true
	case a.VersionValue != nil:
		return "v:" + *a.VersionValue, true
	default:
		return "", false
	}
}

// sameDeviceTaints tells whether two versions of a slice carry the same
// taints on the same devices.
func sameDeviceTaints(a, b *resourceapi.ResourceSlice) bool {
	if len(a.Spec.Devices) != len(b.Spec.Devices) {
		return false
	}
	for i := range a.Spec.Devices {
		da, db := &a.Spec.Devices[i], &b.Spec.Devices[i]
		if da.Name != db.Name || !apiequality.Semantic.DeepEqual(da.Taints, db.Taints) {
			return false
		}
	}
	return true
}
