package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// demoDir holds the shipped example scenario and its topology fixtures.
const demoDir = "../../demo/scenarios"

var (
	v100File = filepath.Join(demoDir, "v100-sxm2-8-aliyun-sccgn6.txt")
	p40File  = filepath.Join(demoDir, "p40-pcie-7.txt")
)

// runCLI runs the command line in-process as the binary gpulink would.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = Execute(append([]string{"gpulink"}, args...), &out, &errOut)
	return out.String(), errOut.String(), code
}

// readTSV reads a tab-separated log the command wrote to path, fails
// the test unless its first line is header, and returns the lines after
// it.
func readTSV(t *testing.T, path, header string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if lines[0] != header {
		t.Fatalf("%s: first line %q, want the header", path, lines[0])
	}
	return lines[1:]
}

// writeFile writes content to dir/name, creating directories, and returns the path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// copyFile copies src to dir/name and returns the new path.
func copyFile(t *testing.T, src, dir, name string) string {
	t.Helper()
	b, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	return writeFile(t, dir, name, string(b))
}
