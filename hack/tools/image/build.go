package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
)

// buildBinaries compiles every binary of the image from the gpulink module
// at repo into outDir, with the flags the Dockerfile uses (-trimpath,
// -ldflags "-s -w"), cgo only where the binary needs it, in one go build per
// cgo setting so that the packages they share compile once.
func buildBinaries(ctx context.Context, goCmd, repo, outDir, goarch string) error {
	for _, cgo := range []bool{false, true} {
		var pkgs []string
		for _, b := range binaries {
			if b.cgo == cgo {
				pkgs = append(pkgs, b.pkg)
			}
		}
		if len(pkgs) == 0 {
			continue
		}
		args := append([]string{"build", "-trimpath", "-ldflags=-s -w", "-o", outDir + string(filepath.Separator)}, pkgs...)
		cmd := exec.CommandContext(ctx, goCmd, args...)
		cmd.Dir = repo
		cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+goarch, "CGO_ENABLED="+map[bool]string{false: "0", true: "1"}[cgo])
		cmd.Stdout = os.Stderr
		cmd.Stderr = os.Stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("go %s (CGO_ENABLED=%t) in %s: %w", strings.Join(args, " "), cgo, repo, err)
		}
	}
	for _, b := range binaries {
		if _, err := os.Stat(filepath.Join(outDir, b.name)); err != nil {
			return fmt.Errorf("go build of %s produced no %s: %w", b.pkg, b.name, err)
		}
	}
	return nil
}

func hostArch() string { return runtime.GOARCH }
