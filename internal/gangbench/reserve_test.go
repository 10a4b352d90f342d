package gangbench

import (
	"slices"
	"testing"
)

// starvedGang is a 32-pod gang that requires one leaf of a 2-leaf cluster
// whose 64 nodes are busy with single 8-GPU pods: one of them ends every
// 100 s and a new one arrives at the same moment, lasting 6,400 s.
func starvedGang() (*Cluster, []Job) {
	c := SuperPOD(64)
	var jobs []Job
	for k := range 64 {
		jobs = append(jobs, Job{ID: k, Submit: 0, Duration: float64(100 * (k + 1)), Pods: 1, GPUsPerPod: 8})
	}
	jobs = append(jobs, Job{ID: 64, Submit: 1, Duration: 1000, Pods: 32, GPUsPerPod: 8})
	for k := 1; k <= 200; k++ {
		jobs = append(jobs, Job{ID: 64 + k, Submit: float64(100 * k), Duration: 6400, Pods: 1, GPUsPerPod: 8})
	}
	return c, jobs
}

// TestStarvationReservation: under the plain backfill queue each node
// freed goes to the single pod arriving with it and the gang never finds
// a whole leaf. With the controller's reservation (bound 900 s) the gang,
// waiting past the bound at t = 1,000, reserves leaf-000 (every leaf full:
// the first by name); the single pods are kept off it from then on, and
// the gang starts when the last one placed there before, at t = 1,000,
// ends: t = 7,400. With the reservation soft for the first hour of the
// gang's wait, each single pod arriving until t = 3,200 fits
// nowhere but the node of leaf-000 that frees with it and takes it; from
// t = 3,300 the nodes freeing are in leaf-001, and from t = 3,601 the
// reservation is strict, so the gang starts when the last of those ends:
// t = 3,200 + 6,400 = 9,600. Soft, it still starts; it waits longer in
// this worst case, where nothing else ever has room.
func TestStarvationReservation(t *testing.T) {
	c, jobs := starvedGang()
	opt := Options{Required: true, StarvationBound: 900, StrictReservationBound: -1}
	plain, err := Replay(c, jobs, 20000, PolicyGPULink, 1, opt)
	if err != nil {
		t.Fatal(err)
	}
	if plain.GangsPlaced != 0 {
		t.Fatalf("plain queue: %d gangs placed, want 0 (starved by the single pods)", plain.GangsPlaced)
	}
	res, err := Replay(c, jobs, 20000, PolicyGPULinkReserving, 1, opt)
	if err != nil {
		t.Fatal(err)
	}
	if res.GangsPlaced != 1 || res.GangsMinimal != 1 {
		t.Fatalf("reserving: %d gangs placed, %d on their minimal level; want 1 and 1", res.GangsPlaced, res.GangsMinimal)
	}
	if res.WaitGangs != 7399 {
		t.Errorf("reserving: the gang waited %g s, want 7,399 (placed when leaf-000 drains at t = 7,400)", res.WaitGangs)
	}
	soft, err := Replay(c, jobs, 20000, PolicyGPULinkReserving, 1, Options{Required: true, StarvationBound: 900, StrictReservationBound: 3600})
	if err != nil {
		t.Fatal(err)
	}
	if soft.GangsPlaced != 1 || soft.WaitGangs != 9599 {
		t.Errorf("soft for an hour: %d gangs placed after %g s, want 1 after 9,599 (leaf-000's last single, placed at t = 3,200 while soft, ends at 9,600)", soft.GangsPlaced, soft.WaitGangs)
	}
	// A bound past the window reserves nothing: the plain queue's result.
	late, err := Replay(c, jobs, 20000, PolicyGPULinkReserving, 1, Options{Required: true, StarvationBound: 30000})
	if err != nil {
		t.Fatal(err)
	}
	if late != (Result{Policy: PolicyGPULinkReserving, Cluster: c.Name, Jobs: plain.Jobs, Gangs: plain.Gangs, WaitGangs: plain.WaitGangs, WaitAll: plain.WaitAll, Util: plain.Util}) {
		t.Errorf("bound past the window: %+v, want the plain queue's %+v", late, plain)
	}
}

// TestClosestDomain: the leaf with the most slots for the gang's pods,
// then the most free GPUs, then the first by name; none when no domain
// could hold the gang even idle, a single node for a gang that fits one,
// and the spine (here the whole cluster) for one larger than a leaf.
func TestClosestDomain(t *testing.T) {
	c := SuperPOD(128) // 4 leaves of 32 nodes, one spine
	if got := closestDomain(newState(c), &Job{Pods: 16, GPUsPerPod: 8}); len(got) != 32 || got[0] != 0 {
		t.Fatalf("idle cluster: reserved from node %v, want leaf-000 (every leaf ties)", head(got))
	}
	s := newState(c)
	for i := range 128 {
		leaf, k := i/32, i%32
		switch {
		case (leaf == 0 || leaf == 3) && k < 20:
			s.take(i, 8) // 12 idle nodes: 12 slots of 8 GPUs, 96 GPUs free
		case leaf == 1 && k < 20:
			s.take(i, 4) // 12 idle nodes and 20 half-free: 12 slots of 8, 176 GPUs free
		case leaf == 2:
			s.take(i, 4) // 32 half-free nodes: no slot of 8, 32 of 4
		}
	}
	cases := []struct {
		name      string
		job       Job
		wantNodes int
		wantFirst int
	}{
		{"16 pods × 8 GPUs: 12 slots in leaves 0, 1 and 3, leaf-001 has the most GPUs free", Job{Pods: 16, GPUsPerPod: 8}, 32, 32},
		{"40 pods × 4 GPUs: leaf-001 has the most slots of 4 (44)", Job{Pods: 40, GPUsPerPod: 4}, 32, 32},
		{"2 pods × 4 GPUs: one node, the first idle one", Job{Pods: 2, GPUsPerPod: 4}, 1, 20},
		{"33 pods × 8 GPUs: larger than a leaf, the spine", Job{Pods: 33, GPUsPerPod: 8}, 128, 0},
		{"129 pods × 8 GPUs: larger than the cluster, nothing", Job{Pods: 129, GPUsPerPod: 8}, 0, 0},
	}
	for _, tc := range cases {
		got := closestDomain(s, &tc.job)
		if len(got) != tc.wantNodes || len(got) > 0 && got[0] != tc.wantFirst {
			t.Errorf("%s: reserved %d nodes from %v, want %d from %d", tc.name, len(got), head(got), tc.wantNodes, tc.wantFirst)
		}
	}
}

func head(nodes []int) any {
	if len(nodes) == 0 {
		return "none"
	}
	return nodes[0]
}

// TestNextHolder: of the gangs past the bound that an idle domain could
// hold, the one of the highest minimal level reserves, the oldest among
// equals; gangs within the bound, single pods and gangs no domain could
// hold are passed over.
func TestNextHolder(t *testing.T) {
	c := SuperPOD(128) // 4 leaves of 32 nodes, one spine
	jobs := []Job{
		{ID: 0, Submit: 0, Pods: 1, GPUsPerPod: 8},     // a single pod: never holds
		{ID: 1, Submit: 10, Pods: 16, GPUsPerPod: 8},   // a leaf, past the bound
		{ID: 2, Submit: 20, Pods: 20, GPUsPerPod: 8},   // a leaf, past the bound, younger
		{ID: 3, Submit: 30, Pods: 40, GPUsPerPod: 8},   // the spine, past the bound
		{ID: 4, Submit: 40, Pods: 200, GPUsPerPod: 8},  // larger than the cluster
		{ID: 5, Submit: 950, Pods: 100, GPUsPerPod: 8}, // the spine, within the bound
		{ID: 6, Submit: 25, Pods: 2, GPUsPerPod: 4},    // one node, past the bound
	}
	js := make([]jobState, len(jobs))
	for i := range jobs {
		js[i] = jobState{job: &jobs[i], start: -1}
	}
	a := passArgs{t: 1000, opt: Options{Required: true, StarvationBound: 900, PreferredStarvationBound: 4 * 3600}}
	cases := []struct {
		name    string
		pending []int
		want    int
		nodes   int
	}{
		{"the spine-sized gang outranks the older leaf-sized ones", []int{0, 1, 2, 3, 4, 5, 6}, 3, 128},
		{"without it, the oldest leaf-sized gang", []int{0, 1, 2, 4, 5, 6}, 1, 32},
		{"a gang of one node when no larger one waits", []int{0, 4, 5, 6}, 6, 1},
		{"none past the bound that a domain could hold", []int{0, 4, 5}, -1, 0},
	}
	for _, tc := range cases {
		got, nodes := nextHolder(newState(c), js, tc.pending, a)
		if got != tc.want || len(nodes) != tc.nodes {
			t.Errorf("%s: holder %d with %d nodes, want %d with %d", tc.name, got, len(nodes), tc.want, tc.nodes)
		}
	}
	// Gangs whose level is only preferred wait their own, longer bound:
	// none of them is past 4 h at t = 1,000, and all but the youngest
	// are at t = 4 h + 50 s.
	a.opt.Required = false
	if got, nodes := nextHolder(newState(c), js, []int{0, 1, 2, 3, 4, 5, 6}, a); got != -1 || nodes != nil {
		t.Errorf("preferred, t = 1,000: holder %d with %d nodes, want none within the 4 h bound", got, len(nodes))
	}
	a.t = 4*3600 + 50
	if got, nodes := nextHolder(newState(c), js, []int{0, 1, 2, 3, 4, 5, 6}, a); got != 3 || len(nodes) != 128 {
		t.Errorf("preferred, t = 4 h + 50 s: holder %d with %d nodes, want the spine-sized gang 3 with 128", got, len(nodes))
	}
}

// TestPreferredStarvationBound: the starved gang of
// TestStarvationReservation, its level only preferred (it may span both
// leaves, but 32 nodes are never free at once), reserves after the
// preferred bound, not the Required one. With 900 s for both it reserves
// leaf-000 at t = 1,000 and starts at 7,400 as under Required; with the
// preferred bound at an hour it reserves at t = 3,700 (the first pass
// past 3,601), when leaf-000's last single, placed at t = 3,200, still
// runs until 9,600. Under Required the preferred bound plays no part.
func TestPreferredStarvationBound(t *testing.T) {
	c, jobs := starvedGang()
	cases := []struct {
		name     string
		opt      Options
		wantWait float64
	}{
		{"preferred, both bounds 900 s", Options{StarvationBound: 900, PreferredStarvationBound: 900, StrictReservationBound: -1}, 7399},
		{"preferred, its bound an hour", Options{StarvationBound: 900, PreferredStarvationBound: 3600, StrictReservationBound: -1}, 9599},
		{"required, the preferred bound an hour", Options{Required: true, StarvationBound: 900, PreferredStarvationBound: 3600, StrictReservationBound: -1}, 7399},
	}
	for _, tc := range cases {
		res, err := Replay(c, jobs, 20000, PolicyGPULinkReserving, 1, tc.opt)
		if err != nil {
			t.Fatal(err)
		}
		if res.GangsPlaced != 1 || res.WaitGangs != tc.wantWait {
			t.Errorf("%s: %d gangs placed after %g s, want 1 after %g", tc.name, res.GangsPlaced, res.WaitGangs, tc.wantWait)
		}
	}
}

// TestSoftReservation: under a soft reservation of leaf-000, a single
// 8-GPU pod goes to the free node of leaf-001 rather than to the free
// node of the reserved leaf; once leaf-001 is full, the next one fits
// nowhere else and takes the reserved leaf's node.
func TestSoftReservation(t *testing.T) {
	c := SuperPOD(64) // leaf-000: nodes 0-31, leaf-001: 32-63
	s := fullBut(c, 5, 40)
	rv := reservation{holder: 0, nodes: firstNodes(32)}
	place := rv.softly(placerOf(PolicyGPULink))
	job := &Job{Pods: 1, GPUsPerPod: 8}
	got := place(s, job, c.H.Cluster(), nil)
	if len(got) != 1 || got[0] != 40 {
		t.Fatalf("fits outside the reserved leaf: placed on %v, want node 40", got)
	}
	s.take(40, 8)
	if got = place(s, job, c.H.Cluster(), nil); len(got) != 1 || got[0] != 5 {
		t.Fatalf("fits nowhere else: placed on %v, want node 5 of the reserved leaf", got)
	}
	if s.free[5] != 8 {
		t.Errorf("the reserved node's room is %d after placing, want 8 (the caller takes it)", s.free[5])
	}
}

// TestSoftReservationKeepsLevel: with leaf-000 reserved softly, a gang of
// 2 pods × 8 GPUs that fits outside it only across two leaves (one node
// free in each of leaf-001 and leaf-002) is placed inside it, where two
// free nodes hold it in one leaf; one that fits in one leaf outside stays
// out.
func TestSoftReservationKeepsLevel(t *testing.T) {
	c := SuperPOD(96) // leaf-000: nodes 0-31, leaf-001: 32-63, leaf-002: 64-95
	s := fullBut(c, 5, 6, 40, 70)
	rv := reservation{holder: 0, nodes: firstNodes(32)}
	place := rv.softly(placerOf(PolicyGPULink))
	gang := &Job{Pods: 2, GPUsPerPod: 8}
	got := place(s, gang, c.H.Cluster(), nil)
	slices.Sort(got)
	if !slices.Equal(got, []int{5, 6}) {
		t.Fatalf("spans two leaves outside the reserved leaf, one inside: placed on %v, want nodes 5 and 6", got)
	}
	s.give(41, 8)
	got = place(s, gang, c.H.Cluster(), nil)
	slices.Sort(got)
	if !slices.Equal(got, []int{40, 41}) {
		t.Fatalf("fits in one leaf outside the reserved one: placed on %v, want nodes 40 and 41", got)
	}
}

// fullBut is a state of c whose nodes are all full but the free ones.
func fullBut(c *Cluster, free ...int) *state {
	s := newState(c)
	for i := range c.Nodes {
		if !slices.Contains(free, i) {
			s.take(i, GPUsPerNode)
		}
	}
	return s
}

// firstNodes is nodes 0 to n-1 (leaf-000 of a SuperPOD when n is 32).
func firstNodes(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}
