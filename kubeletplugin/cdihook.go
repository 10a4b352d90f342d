package kubeletplugin

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// InstallCDIHook copies the nvidia-cdi-hook binary shipped in the plugin's
// image (src) to dir/nvidia-cdi-hook and returns that path. dir must be a
// directory with the same path on the host and in the plugin container
// (the plugin data directory, a hostPath): the container runtime runs the
// hook by the host path written into the CDI spec, and the image's own
// copy has no stable host path (it lives in a snapshot that changes with
// every image). The copy is written to a temporary file and renamed, so a
// runtime starting a container meanwhile runs either the old or the new
// binary, never a half-written one.
func InstallCDIHook(src, dir string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", fmt.Errorf("--cdi-hook-source: %w", err)
	}
	defer func() { _ = in.Close() }()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("creating %s for nvidia-cdi-hook: %w", dir, err)
	}
	dst := filepath.Join(dir, "nvidia-cdi-hook")
	tmp, err := os.CreateTemp(dir, ".nvidia-cdi-hook-*")
	if err != nil {
		return "", fmt.Errorf("installing nvidia-cdi-hook in %s: %w", dir, err)
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if _, err := io.Copy(tmp, in); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("copying %s to %s: %w", src, tmp.Name(), err)
	}
	if err := tmp.Chmod(0o755); err != nil {
		_ = tmp.Close()
		return "", fmt.Errorf("chmod %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return "", fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), dst); err != nil {
		return "", fmt.Errorf("installing %s: %w", dst, err)
	}
	return dst, nil
}
