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

// Nodes reads every node's gpulink pool: the devices of the newest
// generation of each pool named after its node.
func Nodes(ctx context.Context, client kubernetes.Interface) (map[string]*Node, error) {
	list, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("listing ResourceSlices: %w", err)
	}
	newest := map[string]int64{}
	for _, s := range list.Items {
		if s.Spec.Driver != driver.Name || s.Spec.NodeName == nil {
			continue
		}
		if g, ok := newest[s.Spec.Pool.Name]; !ok || s.Spec.Pool.Generation > g {
			newest[s.Spec.Pool.Name] = s.Spec.Pool.Generation
		}
	}
	devices := map[string][]resourceapi.Device{}
	for _, s := range list.Items {
		if s.Spec.Driver != driver.Name || s.Spec.NodeName == nil || s.Spec.Pool.Generation != newest[s.Spec.Pool.Name] {
			continue
		}
		devices[*s.Spec.NodeName] = append(devices[*s.Spec.NodeName], s.Spec.Devices...)
	}
	nodes := map[string]*Node{}
	for name, devs := range devices {
		n, err := newNode(name, devs)
		if err != nil {
			return nil, err
		}
		nodes[name] = n
	}
	return nodes, nil
}

func newNode(name string, devs []resourceapi.Device) (*Node, error) {
	n := &Node{Name: name, byDevice: map[string]GPU{}}
	var tgpus []topology.GPU
	rows := map[int]string{}
	for _, d := range devs {
		if driver.IsMIGDeviceName(d.Name) {
			// MIG devices are not GPUs of the node's link matrix.
			continue
		}
		idx, err := driver.ParseDeviceName(d.Name)
		if err != nil {
			return nil, fmt.Errorf("node %s: %w", name, err)
		}
		g := GPU{Device: d.Name, Index: idx, Minor: idx}
		if a, ok := d.Attributes[driver.AttrMinor]; ok && a.IntValue != nil {
			g.Minor = int(*a.IntValue)
		}
		if a, ok := d.Attributes[driver.AttrUUID]; ok && a.StringValue != nil {
			g.UUID = *a.StringValue
		}
		if a, ok := d.Attributes[driver.AttrProductName]; ok && a.StringValue != nil {
			n.Product = *a.StringValue
		}
		g.Memory = capacity(d, driver.CapacityMemory)
		g.Cores = capacity(d, driver.CapacityCores)
		a, ok := d.Attributes[driver.AttrLinks]
		if !ok || a.StringValue == nil {
			return nil, fmt.Errorf("node %s: device %s has no %s attribute", name, d.Name, driver.AttrLinks)
		}
		rows[idx] = *a.StringValue
		tgpus = append(tgpus, topology.GPU{Index: idx, Minor: g.Minor, UUID: g.UUID, NUMANode: -1})
		n.GPUs = append(n.GPUs, g)
	}
	topo, err := topology.DecodeLinkRows(tgpus, rows)
	if err != nil {
		return nil, fmt.Errorf("node %s: %w", name, err)
	}
	n.Topology = topo
	sort.Slice(n.GPUs, func(i, j int) bool { return n.GPUs[i].Index < n.GPUs[j].Index })
	for i := range n.GPUs {
		p, ok := topo.Position(n.GPUs[i].Index)
		if !ok {
			return nil, fmt.Errorf("node %s: GPU %d missing from the decoded topology", name, n.GPUs[i].Index)
		}
		n.GPUs[i].Position = p
		n.byDevice[n.GPUs[i].Device] = n.GPUs[i]
	}
	return n, nil
}

func capacity(d resourceapi.Device, name string) int64 {
	for _, key := range []string{name, driver.Name + "/" + name} {
		if c, ok := d.Capacity[resourceapi.QualifiedName(key)]; ok {
			return c.Value.Value()
		}
	}
	return 0
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
