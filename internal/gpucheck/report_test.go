package gpucheck

import (
	"strings"
	"testing"
)

func TestReportPrintAndExitCode(t *testing.T) {
	var r Report
	r.Add("a", Pass, "fine")
	r.Add("b", Skip, "one GPU")
	var out strings.Builder
	if err := r.Print(&out); err != nil {
		t.Fatal(err)
	}
	want := "#  CHECK  RESULT  DETAIL\n1  a      PASS    fine\n2  b      SKIP    one GPU\nOK: 1 passed, 0 failed, 1 skipped\n"
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
	if c := r.ExitCode(); c != 0 {
		t.Errorf("exit code %d with no failure, want 0", c)
	}

	r.Add("c", Fail, "line one\n  line two")
	out.Reset()
	if err := r.Print(&out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "3  c      FAIL    line one line two\n") || !strings.HasSuffix(out.String(), "FAILED: 1 passed, 1 failed, 1 skipped\n") {
		t.Errorf("table with a failure:\n%s", out.String())
	}
	if c := r.ExitCode(); c != 1 {
		t.Errorf("exit code %d with a failure, want 1", c)
	}
}

func TestReportNothingRanFails(t *testing.T) {
	var r Report
	r.Add("a", Skip, "dry run")
	if c := r.ExitCode(); c != 1 {
		t.Errorf("exit code %d when every check skipped, want 1", c)
	}
	if c := (&Report{}).ExitCode(); c != 1 {
		t.Errorf("exit code %d for an empty report, want 1", c)
	}
}
