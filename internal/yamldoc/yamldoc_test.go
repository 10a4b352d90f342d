package yamldoc

import (
	"strings"
	"testing"
)

func TestSingleDocument(t *testing.T) {
	for name, tc := range map[string]struct {
		in      string
		wantErr string
	}{
		"one document":              {in: "a: 1\n"},
		"leading separator":         {in: "---\na: 1\n"},
		"comment-only second doc":   {in: "a: 1\n---\n# nothing here\n"},
		"empty input":               {in: ""},
		"two documents":             {in: "a: 1\n---\nb: 2\n", wantErr: "found 2 or more YAML documents"},
		"second document is a list": {in: "a: 1\n---\n- b\n", wantErr: "want exactly one"},
		"malformed yaml":            {in: "a: [1\n", wantErr: "yaml"},
	} {
		t.Run(name, func(t *testing.T) {
			err := SingleDocument([]byte(tc.in))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("SingleDocument(%q) = %v, want nil", tc.in, err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("SingleDocument(%q) = %v, want an error containing %q", tc.in, err, tc.wantErr)
			}
		})
	}
}
