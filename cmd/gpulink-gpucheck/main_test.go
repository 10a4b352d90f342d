package main

import (
	"strings"
	"testing"
)

func TestParseFlags(t *testing.T) {
	f, err := parseFlags([]string{"--dry-run", "--gpu", "2", "--share-memory", "2Gi", "--share-cores", "30"})
	if err != nil {
		t.Fatal(err)
	}
	if !f.cfg.DryRun || f.cfg.GPUIndex != 2 || f.cfg.ShareMemoryBytes != 2<<30 || f.cfg.ShareCores != 30 || f.cfg.NodeName == "" {
		t.Errorf("config %+v", f.cfg)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--share-memory", "lots"}, "--share-memory=lots"},
		{[]string{"--share-memory", "1Ki"}, "--share-memory=1Ki: want a quantity of at least 1Mi"},
		{[]string{"--share-cores", "0"}, "--share-cores=0: want 1..100"},
		{[]string{"extra"}, "unexpected arguments: [extra]"},
	} {
		if _, err := parseFlags(tc.args); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseFlags(%v) = %v, want error containing %q", tc.args, err, tc.want)
		}
	}
}

// The dry run's mock has a GPU in MIG mode by default, so that the MIG
// rows run; --mock-mig names others or none, and a bad value is refused
// naming it.
func TestWireMockMIG(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // error; empty: wired with a MIG instance manager
	}{
		{[]string{"--dry-run"}, ""},
		{[]string{"--dry-run", "--mock-mig="}, ""},
		{[]string{"--dry-run", "--mock-mig=0:;1:7g.80gb"}, ""},
		{[]string{"--dry-run", "--mock-mig=x:"}, `--mock-mig="x:"`},
		{[]string{"--dry-run", "--mock-mig=9:"}, "GPU 9"},
	} {
		f, err := parseFlags(append(tc.args, "--work-dir", t.TempDir()))
		if err != nil {
			t.Fatal(err)
		}
		deps, err := wire(f)
		switch {
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("wire(%v) = %v, want error containing %q", tc.args, err, tc.want)
		case tc.want == "" && (err != nil || deps.MIG == nil || deps.NewMIGPreparer == nil):
			t.Errorf("wire(%v): %v, MIG lister %v; want one with the MIG rows' dependencies", tc.args, err, deps.MIG)
		}
	}
}
