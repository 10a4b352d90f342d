package allocate

import (
	"strings"
	"testing"
)

func TestDemandHistory(t *testing.T) {
	if _, err := NewDemandHistory(0, 1); err == nil {
		t.Fatal("window 0 accepted")
	}
	if _, err := NewDemandHistory(4, 5); err == nil {
		t.Fatal("refresh beyond window accepted")
	}
	h, err := NewDemandHistory(2, 1)
	if err != nil {
		t.Fatal(err)
	}
	if h.Mix() != nil {
		t.Fatal("mix before any record")
	}
	a, b, rare := DemandShape{GPUs: 1}, DemandShape{GPUs: 2}, DemandShape{GPUs: 8, Host: Host{CPUMilli: 120000}}
	if err := h.Know(rare); err != nil {
		t.Fatal(err)
	}
	if h.Mix() == nil {
		t.Fatal("no mix after Know")
	}
	if err := h.Record(DemandShape{}); err == nil {
		t.Fatal("invalid shape recorded")
	}
	for _, s := range []DemandShape{a, a, b} {
		if err := h.Record(s); err != nil {
			t.Fatal(err)
		}
	}
	// Window of 2: a once, b once; each shape ever seen or known +1.
	got := mixCounts(h.Mix())
	want := map[DemandShape]int64{a: 2, b: 2, rare: 1}
	if len(got) != len(want) {
		t.Fatalf("mix %v, want %v", got, want)
	}
	for s, c := range want {
		if got[s] != c {
			t.Fatalf("mix %v, want %v", got, want)
		}
	}
}

// mixCounts is a mix's count per shape.
func mixCounts(m *DemandMix) map[DemandShape]int64 {
	shapes, counts := m.Shapes()
	out := map[DemandShape]int64{}
	for i, s := range shapes {
		out[s] = counts[i]
	}
	return out
}

// A young history is snapshot after every pod while fewer than
// 2×recordedPerSnapshot were recorded, then once an eighth of the pods
// recorded so far came since the last, until that is the refresh: the
// gap between two snapshots never exceeds either, and a controller past
// its start-up snapshots every refresh pods as before.
func TestDemandHistorySnapshotsYoungHistoryOften(t *testing.T) {
	const window, refresh = 512, 256
	h, err := NewDemandHistory(window, refresh)
	if err != nil {
		t.Fatal(err)
	}
	shape := DemandShape{GPUs: 1}
	last, lastAt, snapshots := (*DemandMix)(nil), 0, 0
	for pod := 1; pod <= 8*refresh+4*refresh; pod++ {
		if err := h.Record(shape); err != nil {
			t.Fatal(err)
		}
		if h.Mix() == last {
			continue
		}
		gap := pod - lastAt
		switch {
		case pod <= 2*recordedPerSnapshot && gap != 1:
			t.Fatalf("pod %d: snapshot %d pods after the last, want after every pod while young", pod, gap)
		case gap > max(1, pod/recordedPerSnapshot) || gap > refresh:
			t.Fatalf("pod %d: snapshot %d pods after the last, want at most %d", pod, gap, min(refresh, max(1, pod/recordedPerSnapshot)))
		case pod > 8*refresh+refresh && gap != refresh:
			t.Fatalf("pod %d: snapshot %d pods after the last, want every %d once the history is grown", pod, gap, refresh)
		}
		last, lastAt = h.Mix(), pod
		snapshots++
	}
	// 54 snapshots over the first 2,048 pods, then 4 more (every 256).
	if snapshots < 40 || snapshots > 70 {
		t.Errorf("%d snapshots over %d pods; want about 58 (stranding.go's cost estimate)", snapshots, 12*refresh)
	}
}

// The cluster's GPU products count as one-GPU shapes pinned to each,
// until assumedUntil pods were recorded; a product seen in a recorded
// shape is not counted twice; the same list keeps the mix.
func TestDemandHistoryAssumesProducts(t *testing.T) {
	h, err := NewDemandHistory(DefaultHistoryWindow, DefaultDemandRefresh)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AssumeProducts(nil); err != nil || h.Mix() != nil {
		t.Fatalf("no product: err %v, mix %v; want no mix", err, h.Mix())
	}
	if err := h.AssumeProducts([]string{"Tesla-V100-SXM2-16GB", "", "A100-SXM4-80GB", "Tesla-V100-SXM2-16GB"}); err != nil {
		t.Fatal(err)
	}
	v100, a100 := DemandShape{GPUs: 1, Products: "Tesla-V100-SXM2-16GB"}, DemandShape{GPUs: 1, Products: "A100-SXM4-80GB"}
	if got := mixCounts(h.Mix()); len(got) != 2 || got[v100] != 1 || got[a100] != 1 {
		t.Fatalf("before any pod: mix %v, want each product once", got)
	}
	held := h.Mix()
	if err := h.AssumeProducts([]string{"A100-SXM4-80GB", "Tesla-V100-SXM2-16GB"}); err != nil || h.Mix() != held {
		t.Fatalf("the same products again: err %v, new mix %v; want the mix kept", err, h.Mix() != held)
	}
	err = h.AssumeProducts([]string{"A|B"})
	if err == nil || !strings.Contains(err.Error(), `"A|B"`) {
		t.Fatalf("product with |: got %v, want an error naming it", err)
	}
	if h.Mix() != held {
		t.Fatal("a refused product list changed the mix")
	}
	anywhere := DemandShape{GPUs: 2, Host: Host{CPUMilli: 8000}}
	if err := h.Record(v100); err != nil {
		t.Fatal(err)
	}
	if err := h.Record(anywhere); err != nil {
		t.Fatal(err)
	}
	// v100: recorded once + seen, and not assumed again (the median host
	// per GPU of the four shapes, v100 and anywhere recorded and seen, is
	// the lower of 0, 0, 4000, 4000 millicores: v100's own); a100:
	// assumed; anywhere: once + seen.
	if got := mixCounts(h.Mix()); got[v100] != 2 || got[a100] != 1 || got[anywhere] != 2 || len(got) != 3 {
		t.Fatalf("after two pods: mix %v", got)
	}
	if err := h.Record(anywhere); err != nil {
		t.Fatal(err)
	}
	// Now 0, 0, 4000, 4000, 4000: the assumed shapes ask for 4 cores.
	a100Host := DemandShape{GPUs: 1, Host: Host{CPUMilli: 4000}, Products: a100.Products}
	v100Host := DemandShape{GPUs: 1, Host: Host{CPUMilli: 4000}, Products: v100.Products}
	if got := mixCounts(h.Mix()); got[a100Host] != 1 || got[v100Host] != 1 || got[v100] != 2 || got[anywhere] != 3 || len(got) != 4 {
		t.Fatalf("after three pods: mix %v, want the assumed products at the median host per GPU", got)
	}
	for range assumedUntil - 3 {
		if err := h.Record(anywhere); err != nil {
			t.Fatal(err)
		}
	}
	if h.Assuming() {
		t.Fatalf("still assuming after %d pods", assumedUntil)
	}
	if got := mixCounts(h.Mix()); len(got) != 2 || got[v100] != 2 {
		t.Fatalf("after %d pods: mix %v, want the assumed products gone and the recorded ones kept", assumedUntil, got)
	}
	before := h.Mix()
	if err := h.AssumeProducts([]string{"H100"}); err != nil || h.Mix() != before {
		t.Fatalf("AssumeProducts after the assumption ended: err %v, mix changed %v", err, h.Mix() != before)
	}
}

// What the assumed products are for: with nothing recorded, a pod that
// may run anywhere goes to the product with the most GPU, keeping the
// rare one for pods that may name it, where packing alone would take the
// rare product's smaller nodes first.
func TestAssumedProductsKeepRareProductFree(t *testing.T) {
	host := Host{CPUMilli: 96000, MemoryBytes: 384 * gib}
	nodes := []*NodeState{nodeNow(t, 2, host, "T4", 0), nodeNow(t, 8, host, "G2", 0), nodeNow(t, 8, host, "G2", 0)}
	nodes[0].Name, nodes[1].Name, nodes[2].Name = "t4", "g2-a", "g2-b"
	req := Request{GPUs: 1, Host: Host{CPUMilli: 4000, MemoryBytes: 16 * gib}}
	pol := Policy{Node: Binpack, GPU: Binpack}
	packed, err := ChooseNode(nodes, req, pol)
	if err != nil {
		t.Fatal(err)
	}
	if packed.Node != "t4" {
		t.Fatalf("without a mix: placed on %s, want the small T4 node (binpack)", packed.Node)
	}
	h, err := NewDemandHistory(DefaultHistoryWindow, DefaultDemandRefresh)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.AssumeProducts([]string{"T4", "G2"}); err != nil {
		t.Fatal(err)
	}
	pol.Demand = h.Mix().WithScarcity(nodes)
	got, err := ChooseNode(nodes, req, pol)
	if err != nil {
		t.Fatal(err)
	}
	if got.Node == "t4" {
		t.Fatalf("with the assumed products: placed on %s, want a G2 node", got.Node)
	}
}
