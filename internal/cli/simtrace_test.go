package cli

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpulink/gpulink/internal/tracebench"
)

// TestSimulateTraceFailures: --failures writes the header and one line
// per task not placed, on a trace written here (not the shared one): one
// node of 2 GPUs and 8 cores, tasks asking for both GPUs with 6 cores, so
// that the second and later ones fail short of GPUs.
func TestSimulateTraceFailures(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, tracebench.NodeFile, "sn,cpu_milli,memory_mib,gpu,model\nnode-0,8000,16384,2,T4\n")
	writeFile(t, dir, tracebench.TaskFile("x"), "name,cpu_milli,memory_mib,num_gpu,gpu_milli\npod-0,6000,1024,2,1000\n")
	out := filepath.Join(t.TempDir(), "failures.tsv")
	_, stderr, code := runCLI(t, "simulate", "--trace", dir, "--lists", "x", "--seeds", "1", "--policies", "first-fit",
		"--topologies", "../../driver/topology/testdata", "--failures", out)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows := readTSV(t, out, tracebench.FailureHeader)
	// Arrivals go to 130 % of 2 GPUs: the first task is placed, the next
	// one fails.
	if len(rows) != 1 {
		t.Fatalf("%d lines after the header, want one failed task:\n%s", len(rows), strings.Join(rows, "\n"))
	}
	if f := strings.Split(rows[0], "\t"); f[0] != "x" || f[2] != "first-fit" || f[5] != "pod-0" || f[11] != "gpus" {
		t.Errorf("line %q: want list x, first-fit, pod-0, reason gpus", rows[0])
	}
}

// TestSimulateTraceEndState: --end-state writes the header and one line
// per GPU model of each replay, with the failure log beside it; a path
// that cannot be created is refused with the flag named.
func TestSimulateTraceEndState(t *testing.T) {
	dir := t.TempDir()
	writeFile(t, dir, tracebench.NodeFile, "sn,cpu_milli,memory_mib,gpu,model\nnode-0,8000,16384,2,T4\nnode-1,8000,16384,1,P100\n")
	writeFile(t, dir, tracebench.TaskFile("x"), "name,cpu_milli,memory_mib,num_gpu,gpu_milli\npod-0,6000,1024,2,1000\n")
	out := t.TempDir()
	endState, failures := filepath.Join(out, "end.tsv"), filepath.Join(out, "failures.tsv")
	_, stderr, code := runCLI(t, "simulate", "--trace", dir, "--lists", "x", "--seeds", "2", "--policies", "first-fit",
		"--topologies", "../../driver/topology/testdata", "--end-state", endState, "--failures", failures)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	rows := readTSV(t, endState, tracebench.EndStateHeader)
	// 2 seeds × 2 models. The 2-GPU task only fits node-0: T4 ends with
	// no GPU left, P100 with its one GPU idle.
	if len(rows) != 2*2 {
		t.Fatalf("%d lines after the header, want 4:\n%s", len(rows), strings.Join(rows, "\n"))
	}
	for _, l := range rows {
		f := strings.Split(l, "\t")
		model, idle, free := f[3], f[6], f[9]
		if model == "T4" && (idle != "0" || free != "0") || model == "P100" && (idle != "1" || free != "1000") || model != "T4" && model != "P100" {
			t.Errorf("line %q: want T4 with nothing left, P100 with its GPU idle", l)
		}
	}
	// The failure log beside it: its header, then the one failed task of
	// each seed.
	if rows := readTSV(t, failures, tracebench.FailureHeader); len(rows) != 2 {
		t.Errorf("the failure log beside it: %d lines after the header, want 2", len(rows))
	}

	_, stderr, code = runCLI(t, "simulate", "--trace", dir, "--lists", "x", "--seeds", "1", "--policies", "first-fit",
		"--topologies", "../../driver/topology/testdata", "--end-state", filepath.Join(out, "missing", "end.tsv"))
	if code == 0 || !strings.Contains(stderr, "--end-state") || !strings.Contains(stderr, "missing") {
		t.Errorf("an end-state path in a missing directory: exit %d, %q; want an error naming --end-state and the path", code, stderr)
	}
}
