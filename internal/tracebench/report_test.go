package tracebench

import (
	"bytes"
	"strings"
	"testing"
)

// The table ends with the chart's defaults against FGD and first fit, on a
// running cluster and on a new one, and every policy has its own line style
// in the chart.
func TestReportRatiosAndStyles(t *testing.T) {
	r, err := Replay(synthTrace(), Options{TopologyDir: testTopologies, Seeds: []uint64{1}, Policies: []string{PolicyGpulink, PolicyGpulinkFresh, PolicyFGD, PolicyFirstFit}})
	if err != nil {
		t.Fatal(err)
	}
	var md bytes.Buffer
	if err := WriteMarkdown(&md, []*ListResult{r}, 0); err != nil {
		t.Fatal(err)
	}
	for _, col := range []string{"| gpulink / fgd |", "| gpulink / first-fit |", "| gpulink:fresh / fgd |", "| gpulink:fresh / first-fit |"} {
		if !strings.Contains(md.String(), col) {
			t.Errorf("markdown has no column %q:\n%s", col, md.String())
		}
	}
	if strings.Contains(md.String(), "gpulink+cpu-pods / ") {
		t.Error("a ratio column for a policy that was not replayed")
	}
	for _, p := range AllPolicies {
		if policyStyle[p] == "" {
			t.Errorf("policy %s has no line style", p)
		}
	}
}
