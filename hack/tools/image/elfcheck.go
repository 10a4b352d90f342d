package main

import (
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// libDirs are the directories, relative to the image root, where the
// dynamic loader of a Debian amd64/arm64 system finds libraries.
var libDirs = []string{
	"lib/x86_64-linux-gnu", "usr/lib/x86_64-linux-gnu",
	"lib/aarch64-linux-gnu", "usr/lib/aarch64-linux-gnu",
	"lib64", "usr/lib64", "lib", "usr/lib",
}

// checkDynamic verifies that the ELF program at bin can start on the file
// system rooted at root: its interpreter (the dynamic loader) and every
// DT_NEEDED library exist there, and each library defines every symbol
// version the program needs (GLIBC_2.34, ...), so a program linked against
// a newer glibc than the image's fails here, not at pod start. Static
// programs pass. It returns the versions found, for the build log.
func checkDynamic(bin, root string) ([]string, error) {
	f, err := elf.Open(bin)
	if err != nil {
		return nil, fmt.Errorf("reading ELF %s: %w", bin, err)
	}
	defer f.Close()
	var interp string
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			data := make([]byte, p.Filesz)
			if _, err := p.ReadAt(data, 0); err != nil {
				return nil, fmt.Errorf("%s: reading PT_INTERP: %w", bin, err)
			}
			interp = strings.TrimRight(string(data), "\x00")
		}
	}
	if interp == "" {
		return nil, nil // static
	}
	if _, err := resolveIn(root, interp); err != nil {
		return nil, fmt.Errorf("%s: dynamic loader %s: %w", filepath.Base(bin), interp, err)
	}
	needed, err := f.DynString(elf.DT_NEEDED)
	if err != nil {
		return nil, fmt.Errorf("%s: reading DT_NEEDED: %w", bin, err)
	}
	libs := map[string]string{}
	for _, n := range needed {
		p, err := findLib(root, n)
		if err != nil {
			return nil, fmt.Errorf("%s: needs %s: %w", filepath.Base(bin), n, err)
		}
		libs[n] = p
	}
	needs, err := f.DynamicVersionNeeds()
	if err != nil && !errors.Is(err, elf.ErrNoSymbols) {
		return nil, fmt.Errorf("%s: reading version needs: %w", bin, err)
	}
	var found []string
	for _, need := range needs {
		p, ok := libs[need.Name]
		if !ok {
			if p, err = findLib(root, need.Name); err != nil {
				return nil, fmt.Errorf("%s: needs versions of %s: %w", filepath.Base(bin), need.Name, err)
			}
		}
		defined, err := definedVersions(p)
		if err != nil {
			return nil, err
		}
		for _, dep := range need.Needs {
			if !defined[dep.Dep] {
				return nil, fmt.Errorf("%s needs %s from %s, which the image's %s does not define: "+
					"the binary was linked against a newer glibc than the image holds",
					filepath.Base(bin), dep.Dep, need.Name, strings.TrimPrefix(p, root))
			}
			found = append(found, need.Name+":"+dep.Dep)
		}
	}
	return found, nil
}

func definedVersions(lib string) (map[string]bool, error) {
	f, err := elf.Open(lib)
	if err != nil {
		return nil, fmt.Errorf("reading ELF %s: %w", lib, err)
	}
	defer f.Close()
	vs, err := f.DynamicVersions()
	if err != nil {
		return nil, fmt.Errorf("reading version definitions of %s: %w", lib, err)
	}
	m := map[string]bool{}
	for _, v := range vs {
		m[v.Name] = true
	}
	return m, nil
}

func findLib(root, name string) (string, error) {
	for _, d := range libDirs {
		if p, err := resolveIn(root, path.Join("/", d, name)); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("not found in the image's library directories %v", libDirs)
}

// resolveIn resolves the absolute image path p inside root, following
// symlinks (absolute ones relative to root), and returns the host path of
// the regular file it names.
func resolveIn(root, p string) (string, error) {
	cur := path.Clean("/" + p)
	for hops := 0; hops < 40; hops++ {
		// Resolve the first symlink along cur, component by component.
		parts := strings.Split(strings.TrimPrefix(cur, "/"), "/")
		resolved := "/"
		changed := false
		for i, part := range parts {
			next := path.Join(resolved, part)
			info, err := os.Lstat(filepath.Join(root, next))
			if err != nil {
				return "", fmt.Errorf("%s is not in the image", p)
			}
			if info.Mode()&os.ModeSymlink != 0 {
				target, err := os.Readlink(filepath.Join(root, next))
				if err != nil {
					return "", fmt.Errorf("reading symlink %s: %w", next, err)
				}
				if !path.IsAbs(target) {
					target = path.Join(resolved, target)
				}
				cur = path.Clean(path.Join(append([]string{"/", target}, parts[i+1:]...)...))
				changed = true
				break
			}
			resolved = next
		}
		if !changed {
			info, err := os.Stat(filepath.Join(root, resolved))
			if err != nil || !info.Mode().IsRegular() {
				return "", fmt.Errorf("%s is not a regular file in the image", p)
			}
			return filepath.Join(root, resolved), nil
		}
	}
	return "", fmt.Errorf("%s: too many levels of symlinks in the image", p)
}
