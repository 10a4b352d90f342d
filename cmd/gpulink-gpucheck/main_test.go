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
