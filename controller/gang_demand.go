package controller

import (
	"cmp"
	"slices"

	"github.com/gpulink/gpulink/driver/gang"
)

// gangDemandWindow is how many recent gangs' shapes weigh which domain a
// gang takes (driver/gang's Request.Demand), as the replay's default.
const gangDemandWindow = 256

// gangDemand keeps the shapes (pods × GPUs per pod) of the last
// gangDemandWindow gangs to arrive, each gang counted once, the first time
// it is decided: driver/gang then keeps whole the domains those shapes
// need. Used under the decision lock only, so the demand is a function of
// the decisions' order.
type gangDemand struct {
	ring []gangArrival
	next int
	seen map[string]bool
}

type gangArrival struct {
	key   string
	shape gang.Shape
}

// record counts the gang's shape unless it was counted already.
func (d *gangDemand) record(key string, pods, gpusPerPod int) {
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	if d.seen[key] || pods <= 0 {
		return
	}
	a := gangArrival{key: key, shape: gang.Shape{Pods: pods, GPUsPerPod: gpusPerPod, Count: 1}}
	if len(d.ring) < gangDemandWindow {
		d.ring = append(d.ring, a)
	} else {
		delete(d.seen, d.ring[d.next].key)
		d.ring[d.next] = a
		d.next = (d.next + 1) % gangDemandWindow
	}
	d.seen[key] = true
}

// shapes returns the recent shapes with their counts, largest first.
func (d *gangDemand) shapes() []gang.Shape {
	by := map[[2]int]int{}
	for _, a := range d.ring {
		by[[2]int{a.shape.Pods, a.shape.GPUsPerPod}]++
	}
	out := make([]gang.Shape, 0, len(by))
	for k, n := range by {
		out = append(out, gang.Shape{Pods: k[0], GPUsPerPod: k[1], Count: n})
	}
	slices.SortFunc(out, func(a, b gang.Shape) int {
		return cmp.Or(cmp.Compare(b.Pods*b.GPUsPerPod, a.Pods*a.GPUsPerPod), cmp.Compare(b.Pods, a.Pods))
	})
	return out
}
