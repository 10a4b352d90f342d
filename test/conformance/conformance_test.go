//go:build e2e

// Package conformance_test runs other projects' own test manifests
// (../shared/peer-specs: NVIDIA's GPU DRA driver, the DRA example driver,
// HAMi, Kubernetes' DRA e2e examples) on gpulink, as users moving to
// gpulink bring them: each manifest is read at test time (never copied
// into the project), ported in code by the smallest change (port_test.go),
// run on the local cluster's real node with gpulink deployed as a user
// runs it (cluster_test.go), and checked against the expectation the
// peer-specs README states (nvidia_test.go, exampledriver_test.go,
// hami_test.go, kubernetes_test.go, taints_test.go; the decision for
// every file is peerRows in cases_test.go), from what the containers see
// and from the claims and events.
//
// Every file of the directory gets a row of the table the test prints
// (and the README keeps): pass, not applicable (with what gpulink does
// instead), a known defect (reported, not failing; the case asserts what
// happens now, so the row flips when it is fixed), or a failure. A file
// without a row fails the test, so a new peer file forces a decision;
// TestREADMETable keeps the README's copy of the table in step.
//
// Needs root and the binaries of `hack/cluster.sh build`, `make build` and
// `hack/helm.sh --build`:
//
//	go test -tags integration,e2e -count=1 -v ./test/conformance/
package conformance_test

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpulink/gpulink/test/localcluster"
)

// peerSpecsDir is where CI and developers keep the peer manifests, beside
// the clone.
func peerSpecsDir(t *testing.T) string {
	t.Helper()
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(filepath.Dir(root), "shared", "peer-specs")
}

// peerFiles lists the manifests of dir, relative to it.
func peerFiles(t *testing.T, dir string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		if strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".yaml.tmpl") {
			rel, err := filepath.Rel(dir, p)
			if err != nil {
				return err
			}
			files = append(files, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	return files
}

// outcome is a row's result.
type outcome struct {
	status string // pass, not applicable, known defect: …, FAIL
	detail string
}

func TestConformance(t *testing.T) {
	dir := peerSpecsDir(t)
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("the peer manifests are not at %s (../shared/peer-specs beside the clone): %v", dir, err)
	}
	files := peerFiles(t, dir)
	rows := peerRows()
	for _, f := range files {
		if _, ok := rows[f]; !ok {
			t.Errorf("%s has no row in cases_test.go: run it (a peerCase) or say why it does not apply", f)
		}
	}
	for f := range rows {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("cases_test.go has a row for %s, which %s does not hold", f, dir)
		}
	}
	if t.Failed() {
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("the conformance suite runs a real node (containerd, kubelet) and needs root")
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	e := startEnv(ctx, t)
	t.Logf("gpulink deployed %.1fs after the start", time.Since(begin).Seconds())

	var mu sync.Mutex
	results := map[*peerCase]outcome{}
	for i, batch := range batches(rows) {
		t.Run(fmt.Sprintf("batch %d", i+1), func(t *testing.T) {
			for _, c := range batch {
				t.Run(c.files[0], func(t *testing.T) {
					t.Parallel()
					var o outcome
					defer func() {
						mu.Lock()
						results[c] = o
						mu.Unlock()
					}()
					runCase(ctx, t, e, dir, c, &o)
				})
			}
		})
	}
	t.Logf("conformance table (%.0fs):\n%s", time.Since(begin).Seconds(), table(files, rows, results))
}

// runCase applies a case's files, checks its expectation, cleans up and
// sets its outcome (also when a check stops the case with t.Fatal).
func runCase(ctx context.Context, t *testing.T, e *env, dir string, c *peerCase, out *outcome) {
	r := &run{e: e, c: c, dir: dir, ns: c.namespace(), namespaces: map[string]bool{}}
	detail := ""
	defer func() {
		r.cleanup(ctx, t)
		switch {
		case t.Failed() && c.defect != "":
			t.Errorf("%s: the check of the known defect (%s) no longer sees it: if it is fixed, make this row a pass", c.files[0], c.defect)
			*out = outcome{status: "FAIL", detail: "the known defect's check failed"}
		case t.Failed():
			*out = outcome{status: "FAIL", detail: detail}
		case c.defect != "":
			*out = outcome{status: "known defect: " + c.defect, detail: detail}
		case c.na != "":
			*out = outcome{status: "not applicable", detail: detail}
		default:
			*out = outcome{status: "pass", detail: detail}
		}
	}()
	if c.before != nil {
		c.before(ctx, t, r)
	}
	for _, f := range c.files {
		if !c.applyLater[f] {
			r.applyFile(ctx, t, f)
		}
	}
	if len(r.refused) > 0 && !c.expectRefusal {
		for _, ref := range r.refused {
			t.Errorf("%s: %s %s refused: %v", ref.file, ref.kind, ref.name, ref.err)
		}
		return
	}
	detail = c.check(ctx, t, r)
}

// batches groups the cases so that the GPUs each batch holds fit the real
// node: the cases of one batch run at the same time.
func batches(rows map[string]row) [][]*peerCase {
	seen := map[*peerCase]bool{}
	var cases []*peerCase
	for _, f := range sortedKeys(rows) {
		if c := rows[f].c; c != nil && !seen[c] {
			seen[c] = true
			cases = append(cases, c)
		}
	}
	var out [][]*peerCase
	var cur []*peerCase
	used := 0
	for _, c := range cases {
		if c.alone {
			out = append(out, []*peerCase{c})
			continue
		}
		if used+c.gpus > realGPUs {
			out = append(out, cur)
			cur, used = nil, 0
		}
		cur = append(cur, c)
		used += c.gpus
	}
	if len(cur) > 0 {
		out = append(out, cur)
	}
	return out
}

func sortedKeys(rows map[string]row) []string {
	var out []string
	for k := range rows {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// table renders the rows as markdown, one per file.
func table(files []string, rows map[string]row, results map[*peerCase]outcome) string {
	var b strings.Builder
	b.WriteString("| file | result | notes |\n|---|---|---|\n")
	for _, f := range files {
		r := rows[f]
		status, note := "not applicable", r.na
		if r.c != nil {
			o, ok := results[r.c]
			status, note = o.status, r.c.note
			if o.status == "not applicable" {
				note = r.c.na + "; " + note
			}
			if !ok {
				status = "not run (an earlier failure stopped the suite)"
			}
			if o.detail != "" {
				note = strings.TrimSuffix(note, ".") + "; " + o.detail
			}
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", f, status, note)
	}
	return b.String()
}
