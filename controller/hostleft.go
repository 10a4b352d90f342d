package controller

import (
	"sync"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/driver/allocate"
)

// hostLeft is a node's allocatable CPU and memory minus what the pods
// counted on it request; nil when the Node or its allocatable CPU or
// memory is unknown (the allocator then never counts it short).
func (f *nodeFilter) hostLeft(name string) *allocate.Host {
	node, err := f.nodes.Get(name)
	if err != nil {
		f.allocatable.forget(name)
		return nil
	}
	alloc, ok := f.allocatable.of(name, node)
	if !ok {
		return nil
	}
	var usedCPU, usedMem int64
	if f.fit != nil {
		usedCPU, usedMem = f.fit.requestedOn(name)
	}
	return &allocate.Host{CPUMilli: max(0, alloc.CPUMilli-usedCPU), MemoryBytes: max(0, alloc.MemoryBytes-usedMem)}
}

// allocatableMemo keeps each Node's allocatable CPU and memory as numbers,
// for the Node object they were read from (the informer replaces the
// object on every change). Ranking by stranding reads them for every node
// on every decision, and reading them from the objects' quantity maps
// took as long as the rest of the decision on 5,000 nodes.
type allocatableMemo struct {
	mu     sync.Mutex
	byNode map[string]allocatableEntry
}

type allocatableEntry struct {
	node *corev1.Node
	host allocate.Host
	ok   bool
}

// of returns the node's allocatable CPU and memory; false when either is
// not published.
func (m *allocatableMemo) of(name string, node *corev1.Node) (allocate.Host, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if e, ok := m.byNode[name]; ok && e.node == node {
		return e.host, e.ok
	}
	cpu, okCPU := node.Status.Allocatable[corev1.ResourceCPU]
	mem, okMem := node.Status.Allocatable[corev1.ResourceMemory]
	e := allocatableEntry{node: node, ok: okCPU && okMem}
	if e.ok {
		e.host = allocate.Host{CPUMilli: cpu.MilliValue(), MemoryBytes: mem.Value()}
	}
	if m.byNode == nil {
		m.byNode = map[string]allocatableEntry{}
	}
	m.byNode[name] = e
	return e.host, e.ok
}

// forget drops the entry of a node that is gone.
func (m *allocatableMemo) forget(name string) {
	m.mu.Lock()
	delete(m.byNode, name)
	m.mu.Unlock()
}
