package cli

import (
	"errors"
	"io"
	"os"
	"testing"
)

func TestJoinProblems(t *testing.T) {
	a, b, c := errors.New("a"), errors.New("b\nmore"), errors.New("c")
	tests := []struct {
		name string
		in   []error
		want string // "" means nil
	}{
		{"none", nil, ""},
		{"only nils", []error{nil, nil}, ""},
		{"one", []error{nil, a}, "a"},
		{"several, multi-line indented", []error{a, b}, "2 problems:\n  - a\n  - b\n    more"},
		{"nested lists are flattened", []error{joinProblems([]error{a, b}), c}, "3 problems:\n  - a\n  - b\n    more\n  - c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := joinProblems(tt.in)
			if tt.want == "" {
				if err != nil {
					t.Fatalf("joinProblems = %v, want nil", err)
				}
				return
			}
			if err == nil || err.Error() != tt.want {
				t.Fatalf("joinProblems = %q, want %q", err, tt.want)
			}
		})
	}
	wrapped := joinProblems([]error{a, io.EOF, os.ErrNotExist})
	if !errors.Is(wrapped, io.EOF) || !errors.Is(wrapped, os.ErrNotExist) {
		t.Errorf("errors.Is does not see the problems in %v", wrapped)
	}
}
