package cli

import (
	"os"
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
	data, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if lines[0] != tracebench.FailureHeader {
		t.Fatalf("first line %q, want the header", lines[0])
	}
	// Arrivals go to 130 % of 2 GPUs: the first task is placed, the next
	// one fails.
	if len(lines) != 2 {
		t.Fatalf("%d lines, want the header and one failed task:\n%s", len(lines), data)
	}
	if f := strings.Split(lines[1], "\t"); f[0] != "x" || f[2] != "first-fit" || f[5] != "pod-0" || f[11] != "gpus" {
		t.Errorf("line %q: want list x, first-fit, pod-0, reason gpus", lines[1])
	}
}
