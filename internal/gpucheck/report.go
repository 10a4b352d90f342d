package gpucheck

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
)

// Status is the outcome of one check.
type Status string

const (
	Pass Status = "PASS"
	Fail Status = "FAIL"
	// Skip means the check did not run; Detail says why. A skipped check
	// never makes the suite fail, so only checks that cannot apply on the
	// host (a link matrix on a one-GPU host, GPU checks in a dry run) skip;
	// a check that could not run because something is missing fails.
	Skip Status = "SKIP"
)

// Result is one row of the table.
type Result struct {
	Name   string
	Status Status
	Detail string
}

// Report collects the results of a run in order.
type Report struct {
	Results []Result
}

// Add appends a result.
func (r *Report) Add(name string, s Status, format string, args ...any) {
	r.Results = append(r.Results, Result{Name: name, Status: s, Detail: fmt.Sprintf(format, args...)})
}

// AddAll appends results.
func (r *Report) AddAll(results ...Result) { r.Results = append(r.Results, results...) }

// Counts returns how many checks passed, failed and were skipped.
func (r *Report) Counts() (pass, fail, skip int) {
	for _, res := range r.Results {
		switch res.Status {
		case Pass:
			pass++
		case Fail:
			fail++
		case Skip:
			skip++
		}
	}
	return pass, fail, skip
}

// ExitCode is 0 when no check failed and at least one ran, 1 otherwise:
// a run in which nothing was checked must not look like a success.
func (r *Report) ExitCode() int {
	pass, fail, _ := r.Counts()
	if fail > 0 || pass == 0 {
		return 1
	}
	return 0
}

// Print writes the table of checks and a summary line. Multi-line details
// are folded onto one line so the table stays one row per check.
func (r *Report) Print(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "#\tCHECK\tRESULT\tDETAIL")
	for i, res := range r.Results {
		detail := strings.Join(strings.Fields(res.Detail), " ")
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", i+1, res.Name, res.Status, detail)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("writing the table of checks: %w", err)
	}
	pass, fail, skip := r.Counts()
	verdict := "OK"
	if r.ExitCode() != 0 {
		verdict = "FAILED"
	}
	_, err := fmt.Fprintf(w, "%s: %d passed, %d failed, %d skipped\n", verdict, pass, fail, skip)
	return err
}
