package topology

import (
	"strings"
	"testing"
)

func TestSubset(t *testing.T) {
	topo, err := Parse(strings.NewReader(`	GPU0	GPU1	GPU2	GPU3	CPU Affinity	NUMA Affinity
GPU0	 X 	NV2	SYS	SYS	0-9	0
GPU1	NV2	 X 	SYS	SYS	0-9	0
GPU2	SYS	SYS	 X 	NV1	10-19	1
GPU3	SYS	SYS	NV1	 X 	10-19	1
`))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	sub, err := topo.Subset([]int{1, 2, 3})
	if err != nil {
		t.Fatalf("Subset: %v", err)
	}
	if sub.Len() != 3 || sub.GPUs[0].Index != 1 || sub.GPUs[2].Index != 3 {
		t.Fatalf("Subset GPUs = %+v", sub.GPUs)
	}
	if got := sub.Link(1, 2); got != NVLink(1) {
		t.Errorf("link GPU2-GPU3 = %s, want NV1", got)
	}
	if got := sub.Link(0, 1); got != LinkSYS {
		t.Errorf("link GPU1-GPU2 = %s, want SYS", got)
	}
	row, err := EncodeLinkRow(sub, 0)
	if err != nil || row != ".XSS" {
		t.Errorf("row of GPU1 = %q, %v; want .XSS (GPU0 left out)", row, err)
	}
	if empty, err := topo.Subset(nil); err != nil || empty.Len() != 0 {
		t.Errorf("Subset(nil) = %v, %v; want an empty topology", empty, err)
	}
	if _, err := topo.Subset([]int{4}); err == nil {
		t.Error("Subset accepted position 4 of 4 GPUs")
	}
}
