package planner

import (
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/driver/allocate"
)

// HostLeft is a node's allocatable CPU and memory minus what the pods
// counted on it request; nil when the Node or its allocatable CPU or
// memory is unknown (the allocator then never counts it short).
func (f *NodeFilter) HostLeft(name string) *allocate.Host {
	alloc, ok, known := f.Allocatable.Of(name)
	if !known {
		// Not seen by the Node informer's handler yet (or a filter
		// without one): read the lister once.
		node, err := f.Nodes.Get(name)
		if err != nil {
			return nil
		}
		alloc, ok = f.Allocatable.Set(node)
	}
	if !ok {
		return nil
	}
	return f.left(name, alloc)
}

// knownHostLeft is HostLeft of a node whose allocatable the Node
// informer's handler has recorded, without reading the lister; nil
// otherwise.
func (f *NodeFilter) knownHostLeft(name string) *allocate.Host {
	alloc, ok, known := f.Allocatable.Of(name)
	if !known || !ok {
		return nil
	}
	return f.left(name, alloc)
}

// left is alloc minus what the pods counted on the node request.
func (f *NodeFilter) left(name string, alloc allocate.Host) *allocate.Host {
	var usedCPU, usedMem int64
	if f.Fit != nil {
		usedCPU, usedMem = f.Fit.requestedOn(name)
	}
	return &allocate.Host{CPUMilli: max(0, alloc.CPUMilli-usedCPU), MemoryBytes: max(0, alloc.MemoryBytes-usedMem)}
}

// allocatableMemo keeps each Node's allocatable CPU and memory as numbers,
// kept current by the Node informer's handlers (Controller.onNodeAdd,
// onNodeUpdate, onNodeDelete). Ranking by stranding reads them for every
// node on every decision: reading the Node objects through the lister
// took a quarter of the controller's CPU at 5,000 nodes.
type allocatableMemo struct {
	mu     sync.Mutex
	byNode map[string]allocatableEntry
	// Changed, when set, is told of every node whose entry changes
	// (ranking by stranding keeps scores per node until then).
	Changed func(node string)
}

type allocatableEntry struct {
	host allocate.Host
	// ok: the Node publishes both.
	ok bool
}

// Of returns the node's allocatable CPU and memory; ok is false when
// either is not published, known when the node was set.
func (m *allocatableMemo) Of(name string) (host allocate.Host, ok, known bool) {
	m.mu.Lock()
	e, known := m.byNode[name]
	m.mu.Unlock()
	return e.host, e.ok, known
}

// Set records a Node's allocatable CPU and memory and returns them.
func (m *allocatableMemo) Set(node *corev1.Node) (allocate.Host, bool) {
	cpu, okCPU := node.Status.Allocatable[corev1.ResourceCPU]
	mem, okMem := node.Status.Allocatable[corev1.ResourceMemory]
	e := allocatableEntry{ok: okCPU && okMem}
	if e.ok {
		e.host = allocate.Host{CPUMilli: cpu.MilliValue(), MemoryBytes: mem.Value()}
	}
	m.mu.Lock()
	if m.byNode == nil {
		m.byNode = map[string]allocatableEntry{}
	}
	old, had := m.byNode[node.Name]
	m.byNode[node.Name] = e
	m.mu.Unlock()
	if had && old != e && m.Changed != nil {
		m.Changed(node.Name)
	}
	return e.host, e.ok
}

// Forget drops a deleted node's entry.
func (m *allocatableMemo) Forget(name string) {
	m.mu.Lock()
	_, had := m.byNode[name]
	delete(m.byNode, name)
	m.mu.Unlock()
	if had && m.Changed != nil {
		m.Changed(name)
	}
}
