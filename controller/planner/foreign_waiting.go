package planner

import (
	resourceapi "k8s.io/api/resource/v1"
)

// A pod that found no node waits and is decided again after every change
// in the cluster (the controller's enqueueWaiting). Pods of GPUs and
// other drivers' devices (NICs) take none of the GPU-only shortcuts, so
// each such retry planned every node with its NICs: about 100 ms on 5,000
// nodes, under the decision lock (BenchmarkWaitingGPUsWithNICs). The
// misses below keep, per waiting pod's claims, the nodes that had no
// room and why, so that a retry plans only the nodes that changed.

// maxWaitingClaimSets bounds the waiting pods whose misses are kept
// (about 0.4 KB a node each, mostly the reasons).
const maxWaitingClaimSets = 16

// waitingMisses keeps the misses of the claim sets that found no node,
// by claimsKey. Only a decision that found no node at all writes: a pod
// placed is not decided again, and a stream of them must not push out
// the pods that wait. Decisions are serialized (the decision lock), so it
// needs no lock of its own.
type waitingMisses struct {
	claims *lru[*claimMisses]
}

func newWaitingMisses() *waitingMisses {
	return &waitingMisses{claims: newLRU[*claimMisses](maxWaitingClaimSets)}
}

// claimMisses are one claim set's nodes without room.
type claimMisses struct {
	byNode map[*NodeInventory]missEntry
	// classes are the device classes the claims key names by address
	// (claimsKey), kept so that no other class takes an address while
	// the key is in use.
	classes []*resourceapi.DeviceClass
}

// missEntry is why a node had no room, valid for the state it was found
// on.
type missEntry struct {
	nodeStamp
	why []string
}

// nodeMiss is a miss found by a decision, to keep if the decision finds
// no node at all.
type nodeMiss struct {
	node *NodeInventory
	missEntry
}

// of returns the misses kept for the claims (nil when none, or when the
// claims have no key).
func (w *waitingMisses) of(key string) *claimMisses {
	if key == "" {
		return nil
	}
	m, _ := w.claims.get(key)
	return m
}

// missed returns why the node had no room, when that was found on the
// state at describes.
func (m *claimMisses) missed(n *NodeInventory, at nodeStamp) ([]string, bool) {
	if m == nil {
		return nil, false
	}
	e, ok := m.byNode[n]
	if !ok || e.nodeStamp != at {
		return nil, false
	}
	return e.why, true
}

// keep records a decision's new misses for the claims, which found no
// node: the next decision for them reads them (missed).
func (w *waitingMisses) keep(key string, classes []*resourceapi.DeviceClass, misses []nodeMiss, inv *Inventory) {
	if key == "" || len(misses) == 0 {
		return
	}
	m := w.of(key)
	if m == nil {
		m = &claimMisses{byNode: map[*NodeInventory]missEntry{}, classes: classes}
		w.claims.put(key, m)
	}
	for _, miss := range misses {
		m.byNode[miss.node] = miss.missEntry
	}
	m.byNode = prune(m.byNode, inv)
}
