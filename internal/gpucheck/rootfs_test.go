package gpucheck

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func TestParseLDD(t *testing.T) {
	out := "\tlinux-vdso.so.1 (0x00007ffd)\n" +
		"\tlibstdc++.so.6 => /lib/x86_64-linux-gnu/libstdc++.so.6 (0x00007f1)\n" +
		"\tlibcuda.so.1 => not found\n" +
		"\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)\n" +
		"\t/lib64/ld-linux-x86-64.so.2 (0x00007f3)\n"
	libs, err := ParseLDD(strings.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	want := "/lib/x86_64-linux-gnu/libstdc++.so.6 /lib/x86_64-linux-gnu/libc.so.6 /lib64/ld-linux-x86-64.so.2"
	if strings.Join(libs, " ") != want {
		t.Errorf("libs %v, want %s", libs, want)
	}
	if _, err := ParseLDD(strings.NewReader("\tlibfoo.so.1 => not found\n")); err == nil || !strings.Contains(err.Error(), "library libfoo.so.1: not found") {
		t.Errorf("missing non-driver library: %v", err)
	}
	if _, err := ParseLDD(strings.NewReader("\tlibfoo.so.1 => garbage\n")); err == nil || !strings.Contains(err.Error(), "want <name> => /<path>") {
		t.Errorf("garbage: %v", err)
	}
}

func TestHostRootfs(t *testing.T) {
	host := t.TempDir()
	for _, d := range []string{"usr/bin", "lib64", "etc"} {
		if err := os.MkdirAll(filepath.Join(host, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink("usr/bin", filepath.Join(host, "bin")); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(host, "etc/ld.so.cache"), []byte("cache"), 0o644); err != nil {
		t.Fatal(err)
	}
	rootfs := t.TempDir()
	mounts, err := hostRootfs(rootfs, host)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, m := range mounts {
		got = append(got, m.Destination)
		if m.Destination == "/usr" {
			// Writable for CDI hooks through a scratch upper layer beside
			// the root, never the host's own directory.
			upper := filepath.Join(filepath.Dir(rootfs), "overlay-usr", "upper")
			want := "lowerdir=" + filepath.Join(host, "usr") + ",upperdir=" + upper + ",workdir=" + filepath.Join(filepath.Dir(rootfs), "overlay-usr", "work") + ",nosuid,nodev"
			if m.Type != "overlay" || strings.Join(m.Options, ",") != want {
				t.Errorf("mount %+v, want an overlay with options %s", m, want)
			}
			if fi, err := os.Stat(upper); err != nil || !fi.IsDir() {
				t.Errorf("upper layer %s: %v", upper, err)
			}
			continue
		}
		if m.Type != "bind" || m.Source != filepath.Join(host, m.Destination) || strings.Join(m.Options, ",") != "rbind,ro,nosuid,nodev" {
			t.Errorf("mount %+v", m)
		}
	}
	if strings.Join(got, " ") != "/usr /lib64" {
		t.Errorf("mounts %v, want /usr /lib64 (the host has no /lib, /sbin; /bin is a symlink)", got)
	}
	if l, err := os.Readlink(filepath.Join(rootfs, "bin")); err != nil || l != "usr/bin" {
		t.Errorf("rootfs /bin: %q, %v; want a symlink to usr/bin", l, err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "etc/ld.so.cache")); err != nil || string(b) != "cache" {
		t.Errorf("ld.so.cache copy: %q, %v", b, err)
	}
}

func TestCDIOnlyRootfsCopiesLinkedLibrariesButNotTheDriver(t *testing.T) {
	lib := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(lib, name)
		if err := os.WriteFile(p, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	prog := write("probe", "program")
	libc := write("libc.so.6", "libc")
	libdl := write("libdl.so.2", "libdl") // not linked by the probe, by libcuda
	cuda := write("libcuda.so.1", "driver")
	run := func(_ context.Context, name string, args ...string) ([]byte, error) {
		if name != "ldd" || len(args) != 1 || args[0] != prog {
			t.Fatalf("ran %s %v", name, args)
		}
		return []byte("\tlibc.so.6 => " + libc + " (0x1)\n\tlibcuda.so.1 => " + cuda + " (0x2)\n"), nil
	}
	rootfs := t.TempDir()
	mounts, err := populateRootfs(context.Background(), run, rootfs, Container{Program: prog, Rootfs: RootfsCDIOnly})
	if err != nil {
		t.Fatal(err)
	}
	if len(mounts) != 0 {
		t.Errorf("CDI-only root has mounts %v", mounts)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, libc)); err != nil || string(b) != "libc" {
		t.Errorf("libc copy: %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, libdl)); err != nil || string(b) != "libdl" {
		t.Errorf("libdl copy (glibc beside libc, which the driver links): %q, %v", b, err)
	}
	if b, err := os.ReadFile(filepath.Join(rootfs, "gpucheck/probe")); err != nil || string(b) != "program" {
		t.Errorf("program copy: %q, %v", b, err)
	}
	if _, err := os.Stat(filepath.Join(rootfs, cuda)); !os.IsNotExist(err) {
		t.Errorf("the driver library was copied into the CDI-only root (%v): the CDI spec must provide it", err)
	}
	if _, err := populateRootfs(context.Background(), run, t.TempDir(), Container{Program: prog, Rootfs: "image"}); err == nil || !strings.Contains(err.Error(), `rootfs mode "image"`) {
		t.Errorf("unknown mode: %v", err)
	}
}

func TestBaseSpecDeniesDevicesByDefault(t *testing.T) {
	s := baseSpec([]string{"/gpucheck/probe"}, []string{"A=1"})
	if d := s.Linux.Resources.Devices; len(d) != 1 || d[0].Allow || d[0].Access != "rwm" {
		t.Errorf("device cgroup %+v, want deny all", d)
	}
	if s.Process.Env[len(s.Process.Env)-1] != "A=1" {
		t.Errorf("env %v", s.Process.Env)
	}
	var shm *specs.Mount
	for i := range s.Mounts {
		if s.Mounts[i].Destination == "/dev/shm" {
			shm = &s.Mounts[i]
		}
	}
	if shm == nil || shm.Type != "tmpfs" {
		t.Errorf("/dev/shm %+v, want a private tmpfs", shm)
	}
}
