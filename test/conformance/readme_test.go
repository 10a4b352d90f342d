//go:build e2e

package conformance_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/test/localcluster"
)

// readmeSection is the README section that keeps the conformance table.
const readmeSection = "## Conformance with other projects' test manifests"

// TestREADMETable keeps the README's table in step with the rows (no
// cluster needed): one row per peer file, the result each row is
// expected to have, and the note it starts with. Paste the table
// TestConformance prints after changing a row.
func TestREADMETable(t *testing.T) {
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n"+readmeSection+"\n")
	if !ok {
		t.Fatalf("README.md has no section %q", readmeSection)
	}
	if end := strings.Index(section, "\n## "); end >= 0 {
		section = section[:end]
	}
	rows := peerRows()
	seen := map[string]bool{}
	for _, l := range strings.Split(section, "\n") {
		cells := strings.Split(strings.Trim(l, "|"), " | ")
		if !strings.HasPrefix(l, "| ") || len(cells) < 3 || cells[0] == " file" || strings.HasPrefix(l, "|---") {
			continue
		}
		file, result, note := strings.TrimSpace(cells[0]), cells[1], strings.TrimSpace(strings.Join(cells[2:], " | "))
		r, ok := rows[file]
		if !ok {
			t.Errorf("README.md: row for %s, which has no row in the suite", file)
			continue
		}
		seen[file] = true
		wantResult, wantNote := expected(r)
		if result != wantResult || !strings.HasPrefix(note, wantNote) {
			t.Errorf("README.md: %s: %q, %q; the suite expects %q, a note starting %q", file, result, note, wantResult, wantNote)
		}
	}
	for f := range rows {
		if !seen[f] {
			t.Errorf("README.md: no row for %s", f)
		}
	}
}

// expected is the result and the start of the note a row has when its
// case passes its check.
func expected(r row) (result, note string) {
	switch {
	case r.c == nil:
		return "not applicable", r.na
	case r.c.defect != "":
		return "known defect: " + r.c.defect, r.c.note
	case r.c.na != "":
		return "not applicable", r.c.na
	}
	return "pass", r.c.note
}
