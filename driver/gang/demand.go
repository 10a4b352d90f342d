package gang

import (
	"cmp"
	"slices"
)

// DefaultDemandWindow is how many of the last gangs to arrive a
// DemandHistory keeps by default.
const DefaultDemandWindow = 256

// DemandHistory keeps the shapes (pods × GPUs per pod) of the last Window
// gangs to arrive, each gang counted once (by its key) the first time it
// is recorded: Shapes is then Request.Demand. The controller records a
// gang when it first decides it and `gpulink simulate --gang-trace` when
// a gang arrives, through this one type, so that the replay weighs the
// same demand as the controller. Pods outside any gang are not recorded:
// the controller places them without driver/gang. Not safe for
// concurrent use (the controller holds its decision lock). The zero
// value keeps DefaultDemandWindow gangs.
type DemandHistory struct {
	// Window is how many gangs are kept; 0 means DefaultDemandWindow.
	Window int
	ring   []demandArrival
	next   int
	seen   map[string]bool
}

type demandArrival struct {
	key   string
	shape Shape
}

// Record counts the gang's shape unless the gang (key) is counted
// already; the oldest gang leaves the window when it is full.
func (d *DemandHistory) Record(key string, pods, gpusPerPod int) {
	if d.seen == nil {
		d.seen = map[string]bool{}
	}
	if d.seen[key] || pods <= 0 {
		return
	}
	window := d.Window
	if window <= 0 {
		window = DefaultDemandWindow
	}
	a := demandArrival{key: key, shape: Shape{Pods: pods, GPUsPerPod: gpusPerPod, Count: 1}}
	if len(d.ring) < window {
		d.ring = append(d.ring, a)
	} else {
		delete(d.seen, d.ring[d.next].key)
		d.ring[d.next] = a
		d.next = (d.next + 1) % window
	}
	d.seen[key] = true
}

// Shapes returns the shapes in the window with their counts, the most
// GPUs first (then the most pods): a deterministic order, whatever the
// order of arrival.
func (d *DemandHistory) Shapes() []Shape {
	by := map[[2]int]int{}
	for _, a := range d.ring {
		by[[2]int{a.shape.Pods, a.shape.GPUsPerPod}]++
	}
	out := make([]Shape, 0, len(by))
	for k, n := range by {
		out = append(out, Shape{Pods: k[0], GPUsPerPod: k[1], Count: n})
	}
	slices.SortFunc(out, func(a, b Shape) int {
		return cmp.Or(cmp.Compare(b.Pods*b.GPUsPerPod, a.Pods*a.GPUsPerPod), cmp.Compare(b.Pods, a.Pods))
	})
	return out
}
