package planner

import (
	"slices"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// UsesOf extracts device usage from a claim's allocation: gpulink's
// devices, and other drivers' devices as taken whole (foreignUse).
func UsesOf(claim *resourceapi.ResourceClaim) []DeviceUse {
	if claim.Status.Allocation == nil {
		return nil
	}
	var out []DeviceUse
	var groups map[string]string // by request, for shares
	for i := range claim.Status.Allocation.Devices.Results {
		r := &claim.Status.Allocation.Devices.Results[i]
		if fu, ok := foreignUse(r); ok {
			out = append(out, fu)
			continue
		}
		u, ok := resultUse(r)
		if !ok {
			continue
		}
		if !u.Exclusive {
			g, known := groups[r.Request]
			if !known {
				g = allocatedShareGroup(claim, r.Request)
				if groups == nil {
					groups = map[string]string{}
				}
				groups[r.Request] = g
			}
			u.Group = g
		}
		out = append(out, u)
	}
	return out
}

// allocatedShareGroup is the sharing group of an allocated share of the
// request, from the configuration its allocation carries (the classes'
// layers, then the claim's, as the kubelet plugin reads them), so that
// claims allocated before a restart, or by kube-scheduler, count in their
// group too. A configuration that does not decode is not a concurrent MPS
// share: the kubelet plugin refuses to prepare it anyway. A hold record
// (controller/holds.go) is counted with the deleted claim's namespace,
// requests and configuration, which its annotation keeps, so its shares
// keep their groups.
func allocatedShareGroup(claim *resourceapi.ResourceClaim, request string) string {
	base := resourceclaim.BaseRequestRef(request)
	var classLayers, claimLayers [][]byte
	for _, c := range claim.Status.Allocation.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driver.Name {
			continue
		}
		if len(c.Requests) > 0 && !slices.Contains(c.Requests, request) && !slices.Contains(c.Requests, base) {
			continue
		}
		if c.Source == resourceapi.AllocationConfigSourceClass {
			classLayers = append(classLayers, c.Opaque.Parameters.Raw)
		} else {
			claimLayers = append(claimLayers, c.Opaque.Parameters.Raw)
		}
	}
	if len(classLayers)+len(claimLayers) == 0 || !concurrentLayers(classLayers, claimLayers) {
		return ""
	}
	return ConcurrentGroup(claim.Namespace)
}

// concurrentMemo keeps whether configuration layers make a concurrent MPS
// share, by their bytes: the ledger reads every share claim's allocation
// on every update, claims of one class carry the same layers, and
// decoding them is the costly part.
var concurrentMemo = struct {
	sync.Mutex
	*lru[bool]
}{lru: newLRU[bool](256)}

// concurrentLayers tells whether the layers resolve to a concurrent MPS
// share; layers that do not decode do not.
func concurrentLayers(classLayers, claimLayers [][]byte) bool {
	var key strings.Builder
	for _, l := range classLayers {
		key.Write(l)
		key.WriteByte(0)
	}
	key.WriteByte(1)
	for _, l := range claimLayers {
		key.Write(l)
		key.WriteByte(0)
	}
	concurrentMemo.Lock()
	v, ok := concurrentMemo.get(key.String())
	concurrentMemo.Unlock()
	if ok {
		return v
	}
	cfg, err := v1alpha1.Resolve(classLayers, claimLayers)
	v = err == nil && cfg.ConcurrentMPS()
	concurrentMemo.Lock()
	concurrentMemo.put(key.String(), v)
	concurrentMemo.Unlock()
	return v
}

// resultUse is what one allocation result takes from a gpulink device
// (sliceformat.ResultUse); false for other drivers' results and admin
// access, which take nothing.
func resultUse(r *resourceapi.DeviceRequestAllocationResult) (DeviceUse, bool) {
	u, ok := sliceformat.ResultUse(r)
	if !ok {
		return DeviceUse{}, false
	}
	return DeviceUse{Key: DeviceKey{Pool: u.Pool, Device: u.Device}, Exclusive: u.Exclusive, MemoryBytes: u.MemoryBytes, Cores: u.Cores}, true
}
