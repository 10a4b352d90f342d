// Package gpuview reads what gpulink published and allocated back from the
// API server: each node's GPUs and link matrix (rebuilt from the
// ResourceSlices' links attributes, as the controller does), and the GPUs a
// claim holds. The e2e tests and the `make demo` report (test/e2e/cmd/demoreport)
// use it to check and explain allocations.
package gpuview

import (
	"context"
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// GPU is one published device.
type GPU struct {
	Device   string // ResourceSlice device name, gpu-<index>
	Index    int
	Minor    int
	UUID     string
	Position int // position in Node.Topology
	// Memory (bytes) and Cores (percent) are the device's capacities.
	Memory, Cores int64
}

// Node is one node's pool of gpulink devices.
type Node struct {
	Name     string
	Product  string
	Topology *topology.Topology
	GPUs     []GPU // by ascending index
	byDevice map[string]GPU
}

// GPU returns the GPU published as device name.
func (n *Node) GPU(device string) (GPU, bool) {
	g, ok := n.byDevice[device]
	return g, ok
}

// Nodes reads every node's gpulink pool as the controller does
// (sliceformat.DecodePool: the newest generation of each pool named after
// its node). A pool whose newest generation is still being published is
// left out until it is complete.
func Nodes(ctx context.Context, client kubernetes.Interface) (map[string]*Node, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	pools := map[string][]*resourceapi.ResourceSlice{}
	for i := range list.Items {
		s := &list.Items[i]
		if s.Spec.Driver != driver.Name || s.Spec.NodeName == nil {
			continue
		}
		if err := sliceformat.CheckPoolNode(s); err != nil {
			return nil, err
		}
		pools[s.Spec.Pool.Name] = append(pools[s.Spec.Pool.Name], s)
	}
	nodes := map[string]*Node{}
	for pool, slices := range pools {
		decoded, err := sliceformat.DecodePool(pool, slices)
		if sliceformat.IsIncomplete(err) {
			continue
		}
		if err != nil {
			return nil, err
		}
		nodes[decoded.Node] = newNode(decoded)
	}
	return nodes, nil
}

func newNode(pool *sliceformat.Pool) *Node {
	n := &Node{Name: pool.Node, Topology: pool.Topology, byDevice: map[string]GPU{}}
	for _, g := range pool.GPUs {
		tg := pool.Topology.GPUs[g.Pos]
		if n.Product == "" {
			n.Product = tg.ProductName
		}
		gpu := GPU{Device: g.Device.Name, Index: g.Index, Minor: tg.Minor, UUID: tg.UUID, Position: g.Pos, Memory: tg.MemoryBytes}
		if c, ok := sliceformat.Capacity(g.Device, driver.CapacityCores); ok {
			gpu.Cores = c.Value.Value()
		}
		n.GPUs = append(n.GPUs, gpu)
		n.byDevice[gpu.Device] = gpu
	}
	sort.Slice(n.GPUs, func(i, j int) bool { return n.GPUs[i].Index < n.GPUs[j].Index })
	return n
}

// Consumed returns a share's consumed capacity (0 when absent).
func Consumed(r resourceapi.DeviceRequestAllocationResult, name string) int64 {
	for _, key := range []string{name, driver.Name + "/" + name} {
		if q, ok := r.ConsumedCapacity[resourceapi.QualifiedName(key)]; ok {
			return q.Value()
		}
	}
	return 0
}

// Weakest returns the slowest link between any two of the devices
// (topology.LinkNone for fewer than two).
func (n *Node) Weakest(devices []string) (topology.Link, error) {
	pos := make([]int, 0, len(devices))
	for _, d := range devices {
		g, ok := n.byDevice[d]
		if !ok {
			return topology.LinkNone, fmt.Errorf("node %s has no device %s", n.Name, d)
		}
		pos = append(pos, g.Position)
	}
	return n.Topology.WeakestLink(pos), nil
}

// BestWeakest returns the best weakest link any k of the free devices
// (all devices when free is nil) can have, by exhaustive search; use it
// for small nodes only.
func (n *Node) BestWeakest(k int, free map[string]bool) topology.Link {
	var cand []int
	for _, g := range n.GPUs {
		if free == nil || free[g.Device] {
			cand = append(cand, g.Position)
		}
	}
	best := topology.LinkNone
	found := false
	set := make([]int, 0, k)
	var walk func(start int)
	walk = func(start int) {
		if len(set) == k {
			w := n.Topology.WeakestLink(set)
			if !found || w > best {
				best, found = w, true
			}
			return
		}
		for i := start; i <= len(cand)-(k-len(set)); i++ {
			set = append(set, cand[i])
			walk(i + 1)
			set = set[:len(set)-1]
		}
	}
	walk(0)
	return best
}

// FirstFit returns the k free devices with the lowest indices, what an
// allocator that ignores links (kube-scheduler's) would pick; nil if fewer
// than k are free.
func (n *Node) FirstFit(k int, free map[string]bool) []string {
	var out []string
	for _, g := range n.GPUs {
		if len(out) == k {
			break
		}
		if free[g.Device] {
			out = append(out, g.Device)
		}
	}
	if len(out) < k {
		return nil
	}
	return out
}

// UUIDs returns the UUIDs of the devices, in the given order.
func (n *Node) UUIDs(devices []string) []string {
	out := make([]string, 0, len(devices))
	for _, d := range devices {
		out = append(out, n.byDevice[d].UUID)
	}
	return out
}

// Holding is what one claim holds.
type Holding struct {
	Node    string
	Devices []string // gpulink device names, sorted by index
	Shares  []resourceapi.DeviceRequestAllocationResult
}

// ClaimDevices returns the gpulink devices of an allocated claim and the
// node (pool) they are on; ok is false while the claim is not allocated.
func ClaimDevices(claim *resourceapi.ResourceClaim) (h Holding, ok bool, err error) {
	if claim.Status.Allocation == nil {
		return h, false, nil
	}
	for _, r := range claim.Status.Allocation.Devices.Results {
		if r.Driver != driver.Name {
			continue
		}
		if h.Node != "" && h.Node != r.Pool {
			return h, true, fmt.Errorf("claim %s/%s holds devices of pools %s and %s", claim.Namespace, claim.Name, h.Node, r.Pool)
		}
		h.Node = r.Pool
		h.Devices = append(h.Devices, r.Device)
		if r.ShareID != nil {
			h.Shares = append(h.Shares, r)
		}
	}
	SortDevices(h.Devices)
	return h, true, nil
}

// SortDevices sorts gpu-<index> names by index.
func SortDevices(devices []string) {
	sort.Slice(devices, func(i, j int) bool {
		a, errA := driver.ParseDeviceName(devices[i])
		b, errB := driver.ParseDeviceName(devices[j])
		if errA != nil || errB != nil {
			return devices[i] < devices[j]
		}
		return a < b
	})
}

// Indexes renders device names as "0,3".
func Indexes(devices []string) string {
	parts := make([]string, 0, len(devices))
	for _, d := range devices {
		parts = append(parts, strings.TrimPrefix(d, "gpu-"))
	}
	return strings.Join(parts, ",")
}
