package cli

import "testing"

func TestFormatIndices(t *testing.T) {
	tests := []struct {
		in   []int
		want string
	}{
		{nil, "-"},
		{[]int{3}, "3"},
		{[]int{0, 1}, "0,1"},
		{[]int{0, 1, 2, 3}, "0-3"},
		{[]int{0, 1, 2, 3, 6}, "0-3,6"},
		{[]int{0, 2, 4}, "0,2,4"},
		{[]int{1, 2, 4, 5, 6, 9}, "1,2,4-6,9"},
	}
	for _, tt := range tests {
		if got := formatIndices(tt.in); got != tt.want {
			t.Errorf("formatIndices(%v) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
