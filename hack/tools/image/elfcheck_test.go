package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// hostDynamic returns a dynamically linked program of the test host (a cgo
// hello world built here), or skips when no C toolchain is there.
func hostDynamic(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\n// #include <stdio.h>\nimport \"C\"\n\nfunc main() { C.puts(C.CString(\"hi\")) }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "hello")
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("no cgo toolchain to build a dynamic program: %v\n%s", err, out)
	}
	return bin
}

func TestCheckDynamic(t *testing.T) {
	bin := hostDynamic(t)

	// On the host's own root the program runs: loader, libc and every
	// symbol version are there.
	versions, err := checkDynamic(bin, "/")
	if err != nil {
		t.Fatalf("host root: %v", err)
	}
	if !strings.Contains(strings.Join(versions, " "), "libc.so.6:GLIBC_") {
		t.Errorf("versions %v name no GLIBC_ version of libc.so.6", versions)
	}

	// An empty root has no dynamic loader.
	if _, err := checkDynamic(bin, t.TempDir()); err == nil || !strings.Contains(err.Error(), "dynamic loader") {
		t.Errorf("empty root: err = %v, want a missing-loader error", err)
	}

	// A root whose libc.so.6 defines no GLIBC_ versions (another ELF
	// library in its place): the glibc-too-old error.
	interp, libcPath := loaderAndLibc(t, bin)
	other := ""
	for _, cand := range []string{"/lib/x86_64-linux-gnu/libz.so.1", "/usr/lib/x86_64-linux-gnu/libz.so.1", "/lib/aarch64-linux-gnu/libz.so.1"} {
		if _, err := os.Stat(cand); err == nil {
			other = cand
		}
	}
	if other == "" {
		t.Skip("no libz.so.1 on the host to stand in for an old glibc")
	}
	root := t.TempDir()
	copyTo(t, interp, filepath.Join(root, interp))
	copyTo(t, other, filepath.Join(root, "lib/x86_64-linux-gnu", filepath.Base(libcPath)))
	if _, err := checkDynamic(bin, root); err == nil || !strings.Contains(err.Error(), "newer glibc") {
		t.Errorf("libc without GLIBC_ versions: err = %v, want the newer-glibc error", err)
	}

}

func TestCheckDynamicStatic(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nfunc main() {}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(dir, "static")
	cmd := exec.Command("go", "build", "-o", bin, src)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	if v, err := checkDynamic(bin, t.TempDir()); err != nil || len(v) != 0 {
		t.Fatalf("static program on an empty root: versions %v, err %v; want none, nil", v, err)
	}
}

func loaderAndLibc(t *testing.T, bin string) (interp, libc string) {
	t.Helper()
	out, err := exec.Command("ldd", bin).Output()
	if err != nil {
		t.Skipf("ldd: %v", err)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		switch {
		case len(f) >= 3 && f[0] == "libc.so.6":
			libc = f[2]
		case len(f) >= 1 && strings.Contains(f[0], "ld-linux"):
			interp = f[0]
		}
	}
	if interp == "" || libc == "" {
		t.Skipf("ldd output without loader or libc:\n%s", out)
	}
	// checkDynamic looks the loader up by the program's PT_INTERP path.
	return interp, libc
}

func copyTo(t *testing.T, src, dst string) {
	t.Helper()
	data, err := os.ReadFile(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(dst, data, 0o755); err != nil {
		t.Fatal(err)
	}
}
