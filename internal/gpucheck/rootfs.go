package gpucheck

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// RootfsMode says how a container's root file system is made. The suite
// needs no image: either mode is built from files of the host.
type RootfsMode string

const (
	// RootfsHost bind-mounts the host's /usr, /lib*, /bin and /sbin
	// read-only into an otherwise empty root, and copies the host's
	// /etc/ld.so.cache. The container sees the host's CUDA toolkit and
	// driver libraries, so it tests device isolation and MPS limits
	// independently of the driver files the CDI spec mounts.
	RootfsHost RootfsMode = "host"
	// RootfsCDIOnly holds only the program and the non-driver libraries it
	// links (copied as ldd lists them), as an image such as nvidia/cuda
	// does: libcuda and the other driver files must come from the CDI spec.
	RootfsCDIOnly RootfsMode = "cdi-only"
)

// hostSystemDirs are bound read-only into a RootfsHost root when present.
var hostSystemDirs = []string{"/usr", "/lib", "/lib32", "/lib64", "/libx32", "/bin", "/sbin"}

// driverLibrary matches user-space driver files, which a CDI-only root must
// not get from the host copy: they are what the CDI spec has to provide.
var driverLibrary = regexp.MustCompile(`^lib(cuda|nvidia-[a-z0-9-]+|nvcuvid|nvoptix|cudadebugger)\.so`)

// populateRootfs creates the root file system of c under rootfs and
// returns the bind mounts it needs.
func populateRootfs(ctx context.Context, run Runner, rootfs string, c Container) ([]specs.Mount, error) {
	for _, d := range []string{"proc", "dev", "sys", "tmp", "etc", "gpucheck"} {
		if err := os.MkdirAll(filepath.Join(rootfs, d), 0o755); err != nil {
			return nil, fmt.Errorf("creating the container's root: %w", err)
		}
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc/passwd"), []byte("root:x:0:0:root:/tmp:/bin/sh\n"), 0o644); err != nil {
		return nil, fmt.Errorf("creating the container's root: %w", err)
	}
	if err := os.WriteFile(filepath.Join(rootfs, "etc/group"), []byte("root:x:0:\n"), 0o644); err != nil {
		return nil, fmt.Errorf("creating the container's root: %w", err)
	}
	if err := copyFile(c.Program, filepath.Join(rootfs, c.ProgramPath())); err != nil {
		return nil, fmt.Errorf("copying the program into the container's root: %w", err)
	}
	switch c.Rootfs {
	case RootfsHost:
		return hostRootfs(rootfs, "/")
	case RootfsCDIOnly:
		return nil, copyLinkedLibraries(ctx, run, rootfs, c.Program)
	default:
		return nil, fmt.Errorf("rootfs mode %q: want %s or %s", c.Rootfs, RootfsHost, RootfsCDIOnly)
	}
}

// hostRootfs prepares the mountpoints of the host's system directories
// (read from hostRoot) under rootfs. Directories that are symlinks on the
// host (merged /usr: /bin -> usr/bin) become the same symlinks.
func hostRootfs(rootfs, hostRoot string) ([]specs.Mount, error) {
	var mounts []specs.Mount
	for _, d := range hostSystemDirs {
		host := filepath.Join(hostRoot, d)
		fi, err := os.Lstat(host)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("host directory %s: %w", host, err)
		}
		target := filepath.Join(rootfs, d)
		if fi.Mode()&os.ModeSymlink != 0 {
			link, err := os.Readlink(host)
			if err != nil {
				return nil, fmt.Errorf("host directory %s: %w", host, err)
			}
			if err := os.Symlink(link, target); err != nil {
				return nil, fmt.Errorf("creating the container's root: %w", err)
			}
			continue
		}
		if err := os.MkdirAll(target, 0o755); err != nil {
			return nil, fmt.Errorf("creating the container's root: %w", err)
		}
		if d == "/usr" {
			// CDI hooks create links under /usr (nvidia-cdi-hook
			// create-symlinks: /usr/local/nvidia/lib64/gbm/... where the
			// driver lives there), as they do in an image's writable
			// layer. An overlay with a scratch upper layer beside the
			// root gives them one and leaves the host's /usr untouched;
			// a read-only bind made the hook fail on the first GPU host.
			m, err := scratchOverlay(filepath.Dir(rootfs), d, host)
			if err != nil {
				return nil, err
			}
			mounts = append(mounts, m)
			continue
		}
		mounts = append(mounts, specs.Mount{Destination: d, Type: "bind", Source: host, Options: []string{"rbind", "ro", "nosuid", "nodev"}})
	}
	// A copy, not a mount: CDI hooks (update-ldcache) rewrite it.
	cache := filepath.Join(hostRoot, "etc/ld.so.cache")
	if _, err := os.Stat(cache); err == nil {
		if err := copyFile(cache, filepath.Join(rootfs, "etc/ld.so.cache")); err != nil {
			return nil, fmt.Errorf("copying the host's ld.so.cache: %w", err)
		}
	}
	return mounts, nil
}

// scratchOverlay is an overlay mount of the host directory host at
// destination whose writes land in upper and work directories under
// scratch (outside the container's root), never on the host directory.
func scratchOverlay(scratch, destination, host string) (specs.Mount, error) {
	base := filepath.Join(scratch, "overlay"+strings.ReplaceAll(destination, "/", "-"))
	upper, work := filepath.Join(base, "upper"), filepath.Join(base, "work")
	for _, dir := range []string{upper, work} {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return specs.Mount{}, fmt.Errorf("creating the overlay of the container's %s: %w", destination, err)
		}
	}
	return specs.Mount{Destination: destination, Type: "overlay", Source: "overlay",
		Options: []string{"lowerdir=" + host, "upperdir=" + upper, "workdir=" + work, "nosuid", "nodev"}}, nil
}

// copyLinkedLibraries copies the shared libraries program links, as ldd
// resolves them on this host, to the same paths under rootfs. Driver
// libraries are left out: the CDI spec must provide them.
func copyLinkedLibraries(ctx context.Context, run Runner, rootfs, program string) error {
	out, err := run(ctx, "ldd", program)
	if err != nil {
		if bytes.Contains(out, []byte("not a dynamic executable")) {
			return nil
		}
		return fmt.Errorf("ldd %s: %w (output: %q)", program, err, strings.TrimSpace(string(out)))
	}
	libs, err := ParseLDD(bytes.NewReader(out))
	if err != nil {
		return fmt.Errorf("ldd %s: %w", program, err)
	}
	for _, l := range libs {
		if driverLibrary.MatchString(filepath.Base(l)) {
			continue
		}
		if err := copyFile(l, filepath.Join(rootfs, l)); err != nil {
			return fmt.Errorf("copying %s (linked by %s): %w", l, program, err)
		}
		if filepath.Base(l) == "libc.so.6" {
			if err := copyGlibcCompanions(filepath.Dir(l), rootfs); err != nil {
				return err
			}
		}
	}
	return nil
}

// glibcCompanions are the parts of glibc that every glibc-based image
// has beside libc.so.6 and that the driver's libcuda links (its first run
// on a GPU host stopped at "libdl.so.2 not found", which CUDA reports as
// a driver too old), though the probe itself does not link them.
var glibcCompanions = []string{"libdl.so.2", "libpthread.so.0", "librt.so.1", "libm.so.6"}

// copyGlibcCompanions copies those of glibcCompanions that dir (where
// libc.so.6 is) holds into the same path under rootfs.
func copyGlibcCompanions(dir, rootfs string) error {
	for _, name := range glibcCompanions {
		src := filepath.Join(dir, name)
		if _, err := os.Stat(src); os.IsNotExist(err) {
			continue
		}
		if err := copyFile(src, filepath.Join(rootfs, src)); err != nil {
			return fmt.Errorf("copying %s (glibc, linked by the driver's libraries): %w", src, err)
		}
	}
	return nil
}

// ParseLDD returns the absolute paths of the libraries in ldd output,
// the dynamic loader included. A library ldd cannot find is an error,
// unless it is a driver library, which the CDI spec has to provide.
func ParseLDD(r io.Reader) ([]string, error) {
	var libs []string
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		name, target, arrow := strings.Cut(line, "=>")
		name, target = strings.TrimSpace(name), strings.TrimSpace(target)
		if !arrow {
			// "/lib64/ld-linux-x86-64.so.2 (0x...)" or "linux-vdso.so.1 (0x...)"
			path, _, _ := strings.Cut(line, " ")
			if strings.HasPrefix(path, "/") {
				libs = append(libs, path)
			}
			continue
		}
		if strings.HasPrefix(target, "not found") {
			if driverLibrary.MatchString(name) {
				continue
			}
			return nil, fmt.Errorf("library %s: not found on this host", name)
		}
		path, _, _ := strings.Cut(target, " ")
		if !strings.HasPrefix(path, "/") {
			return nil, fmt.Errorf("line %q: want <name> => /<path> (0x<address>)", line)
		}
		libs = append(libs, path)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading ldd output: %w", err)
	}
	return libs, nil
}

// copyFile copies src (following symlinks) to dst with src's mode,
// creating dst's directory.
func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, fi.Mode().Perm())
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
