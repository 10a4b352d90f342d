package planner

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/gpulink/gpulink/driver/allocate"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// Shares of a GPU on one node: what a share takes from a device, the
// caps that apply while it is placed, memoised per node inventory.

// maxSharesPerGPU is the node state's share cap while placing the
// alternative: its config's maxSharesPerGPU for a share, else none.
func maxSharesPerGPU(alt *Alternative) int {
	if alt.Share && alt.Config != nil && alt.Config.Sharing != nil && alt.Config.Sharing.MaxSharesPerGPU != nil {
		return *alt.Config.Sharing.MaxSharesPerGPU
	}
	return 0
}

// memoryOvercommit is the node state's memory over-commit while placing
// the alternative: its config's memoryOvercommitPercent for a share (the
// DeviceClass's opt-in, which a claim may only lower), else none.
func memoryOvercommit(alt *Alternative) int {
	if alt.Share && alt.Config != nil && alt.Config.Sharing != nil && alt.Config.Sharing.MemoryOvercommitPercent != nil {
		return *alt.Config.Sharing.MemoryOvercommitPercent
	}
	return 0
}

// shareConsumption computes what a share of the alternative takes from a
// device: every capacity the device publishes (as kube-scheduler records
// it), and the memory/cores the allocator accounts.
func shareConsumption(d *DeviceInfo, alt *Alternative) (*allocate.ShareRequest, map[resourceapi.QualifiedName]resource.Quantity, error) {
	consumed := map[resourceapi.QualifiedName]resource.Quantity{}
	share := &allocate.ShareRequest{Group: alt.ShareGroup}
	haveMem := false
	for name, c := range d.CEL.Capacity {
		fq := qualify(string(name), d.CEL.Driver)
		var want *resource.Quantity
		if q, ok := alt.Capacity[fq]; ok {
			want = &q
		} else if fq == capMemory && alt.ConfigMemory != nil {
			want = alt.ConfigMemory
		} else if fq == capCores && alt.ConfigCores != nil {
			want = resource.NewQuantity(*alt.ConfigCores, resource.DecimalSI)
		}
		v, err := consumption(want, c)
		if err != nil {
			return nil, nil, fmt.Errorf("capacity %s: %w", name, err)
		}
		consumed[name] = *resource.NewQuantity(v, c.Value.Format)
		switch fq {
		case capMemory:
			share.MemoryBytes, haveMem = v, true
		case capCores:
			share.Cores = v
		}
	}
	for fq := range alt.Capacity {
		if _, ok := d.capacity(fq); !ok {
			return nil, nil, fmt.Errorf("the request asks for capacity %s, which the device does not publish", fq)
		}
	}
	if !haveMem {
		return nil, nil, errors.New("the device publishes no memory capacity, so it cannot be shared")
	}
	if _, ok := d.capacity(capCores); !ok {
		// Without a cores capacity the device is shared by memory only;
		// the allocator still needs a compute share to account.
		share.Cores = 1
		if alt.Config != nil && alt.Config.Sharing != nil && alt.Config.Sharing.DefaultCores != nil {
			share.Cores = *alt.Config.Sharing.DefaultCores
		}
	}
	if share.MemoryBytes < 1 || share.Cores < 1 || share.Cores > 100 {
		return nil, nil, fmt.Errorf("share of %d bytes and %d%% cores is outside what one GPU can give", share.MemoryBytes, share.Cores)
	}
	return share, consumed, nil
}

// shareCons is the memoised consumption of one share on one device.
type shareCons struct {
	share    *allocate.ShareRequest
	consumed map[resourceapi.QualifiedName]resource.Quantity
	key      string
	err      error
}

// shareCons returns what a share of the alternative takes from the device
// at pos, memoised per node inventory and share signature.
func (n *NodeInventory) shareCons(alt *Alternative, pos int) *shareCons {
	memoKey := "share:" + alt.shareSig
	n.memoMu.Lock()
	row, ok := n.shareMemo.get(memoKey)
	if !ok {
		row = make([]*shareCons, len(n.Devices))
		n.shareMemo.put(memoKey, row)
	}
	sc := row[pos]
	n.memoMu.Unlock()
	if sc != nil {
		return sc
	}
	sc = sharedShareCons(n.Devices[pos], alt)
	n.memoMu.Lock()
	row[pos] = sc
	n.memoMu.Unlock()
	return sc
}

// shareConsEntries bounds sharedConsumptions: the share shapes of the
// pods being decided times the kinds of capacities the cluster's GPUs
// publish, far fewer in practice.
const shareConsEntries = 1024

// sharedConsumptions memoises shareCons across node inventories by share
// signature and the device's capacities (sliceformat.CapacitySignature):
// the consumption depends on nothing else, and identical GPUs of
// different nodes then share one value. Kept per node, one map of
// quantities, one key string and one share request per GPU, node and
// share shape took a sixth of the controller's live heap at 5,000 nodes
// (test/scale's heap profile). Values are never written once stored.
var sharedConsumptions = struct {
	sync.Mutex
	lru *lru[*shareCons]
}{lru: newLRU[*shareCons](shareConsEntries)}

// sharedShareCons returns what a share of the alternative takes from d,
// from sharedConsumptions when another device with d's capacities has
// been asked already.
func sharedShareCons(d *DeviceInfo, alt *Alternative) *shareCons {
	capSig, ok := sliceformat.CapacitySignature(d.CEL.Capacity)
	if !ok {
		return newShareCons(d, alt)
	}
	key := alt.shareSig + "\x00" + d.CEL.Driver + "\x00" + capSig
	sharedConsumptions.Lock()
	sc, found := sharedConsumptions.lru.get(key)
	sharedConsumptions.Unlock()
	if found {
		return sc
	}
	sc = newShareCons(d, alt)
	sharedConsumptions.Lock()
	sharedConsumptions.lru.put(key, sc)
	sharedConsumptions.Unlock()
	return sc
}

// newShareCons computes what a share of the alternative takes from d.
func newShareCons(d *DeviceInfo, alt *Alternative) *shareCons {
	sc := &shareCons{}
	sc.share, sc.consumed, sc.err = shareConsumption(d, alt)
	if sc.err == nil {
		names := make([]string, 0, len(sc.consumed))
		for name := range sc.consumed {
			names = append(names, string(name))
		}
		sort.Strings(names)
		var b strings.Builder
		fmt.Fprintf(&b, "share=%d/%d;", sc.share.MemoryBytes, sc.share.Cores)
		for _, name := range names {
			q := sc.consumed[resourceapi.QualifiedName(name)]
			b.WriteString(name + "=" + q.String() + ";")
		}
		sc.key = b.String()
	}
	return sc
}
