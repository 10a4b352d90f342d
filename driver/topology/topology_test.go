package topology

import (
	"strings"
	"testing"
)

func TestNewErrors(t *testing.T) {
	two := []GPU{{Index: 0}, {Index: 1}}
	tests := []struct {
		name  string
		gpus  []GPU
		links [][]Link
		want  string
	}{
		{"too many GPUs", make([]GPU, MaxGPUs+1), nil, "65 GPUs on one node"},
		{"row count", two, [][]Link{{LinkNone, LinkSYS}}, "link matrix has 1 rows for 2 GPUs"},
		{"negative index", []GPU{{Index: -2}}, [][]Link{{LinkNone}}, "negative index -2"},
		{"duplicate index", []GPU{{Index: 1}, {Index: 1}}, [][]Link{{LinkNone, LinkSYS}, {LinkSYS, LinkNone}}, "duplicate GPU index 1"},
		{"short row", two, [][]Link{{LinkNone}, {LinkSYS, LinkNone}}, "row 0 (GPU0) has 1 cells, want 2"},
		{"missing link", two, [][]Link{{LinkNone, LinkNone}, {LinkNone, LinkNone}}, "no link between GPU0 and GPU1"},
		{"asymmetric", two, [][]Link{{LinkNone, LinkPIX}, {LinkSYS, LinkNone}}, "GPU0->GPU1 is PIX but GPU1->GPU0 is SYS"},
		{"value between PIX and NV1", two, [][]Link{{LinkNone, LinkPIX + 1}, {LinkPIX + 1, LinkNone}}, "invalid class value 6"},
		{"more lanes than exist", two, [][]Link{{LinkNone, Link(200)}, {Link(200), LinkNone}}, "invalid class value 200"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.gpus, tt.links)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("New error = %v, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestLinkValid(t *testing.T) {
	tests := []struct {
		link Link
		want bool
	}{
		{LinkNone, false},
		{LinkSYS, true},
		{LinkPIX, true},
		{LinkPIX + 1, false},
		{NVLink(1), true},
		{NVLink(MaxNVLinkLanes), true},
		{NVLink(MaxNVLinkLanes) + 1, false},
	}
	for _, tt := range tests {
		if got := tt.link.Valid(); got != tt.want {
			t.Errorf("Link(%d).Valid() = %v, want %v", uint8(tt.link), got, tt.want)
		}
	}
}

func TestPosition(t *testing.T) {
	topo, err := Parse(strings.NewReader("\tGPU0\tGPU2\tGPU5\nGPU0\t X \tSYS\tSYS\nGPU2\tSYS\t X \tPIX\nGPU5\tSYS\tPIX\t X \n"))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		index, pos int
		ok         bool
	}{
		{0, 0, true},
		{2, 1, true},
		{5, 2, true},
		{1, -1, false},
		{6, -1, false},
	}
	for _, tt := range tests {
		if pos, ok := topo.Position(tt.index); pos != tt.pos || ok != tt.ok {
			t.Errorf("Position(%d) = %d, %v; want %d, %v", tt.index, pos, ok, tt.pos, tt.ok)
		}
	}
}
