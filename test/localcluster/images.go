package localcluster

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"strings"
	"time"
)

// Images of the local cluster. Both are static Go binaries from test/images
// packed as single-layer images; pods must use imagePullPolicy: Never.
const (
	// PauseImage is the sandbox image pinned in the containerd configuration.
	PauseImage = "gpulink.local/test/pause:v1"
	// WorkloadImage prints its sorted environment and /dev/nvidia* entries,
	// then sleeps until SIGTERM (see test/images/workload).
	WorkloadImage = "gpulink.local/test/workload:v1"
)

const modulePath = "github.com/gpulink/gpulink"

// testImages maps the images Start imports on a real node to their packages.
var testImages = []struct{ ref, pkg string }{
	{PauseImage, modulePath + "/test/images/pause"},
	{WorkloadImage, modulePath + "/test/images/workload"},
}

// RepoRoot returns the root of the gpulink checkout: $GPULINK_REPO_DIR when
// set, else the nearest directory at or above the working directory whose
// go.mod declares module github.com/gpulink/gpulink.
func RepoRoot() (string, error) {
	if d := os.Getenv("GPULINK_REPO_DIR"); d != "" {
		return filepath.Abs(d)
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("finding the gpulink repository: %w", err)
	}
	for d := wd; ; d = filepath.Dir(d) {
		data, err := os.ReadFile(filepath.Join(d, "go.mod"))
		if err == nil {
			for _, line := range strings.Split(string(data), "\n") {
				f := strings.Fields(line)
				if len(f) == 2 && f[0] == "module" && f[1] == modulePath {
					return d, nil
				}
			}
		}
		if parent := filepath.Dir(d); parent == d {
			return "", fmt.Errorf("no go.mod of module %s at or above %s (set GPULINK_REPO_DIR)", modulePath, wd)
		}
	}
}

// BuildImage compiles the main package pkg (an import path inside the gpulink
// module, e.g. "github.com/gpulink/gpulink/test/images/workload") as a static
// binary and packs it into a docker-archive tar (manifest.json, a config and
// one layer holding the binary at /<base name of pkg>, which is also the
// entrypoint) tagged ref. The tar is written atomically to
// <outDir>/<base name of pkg>.tar, whose path is returned. The archive is
// reproducible: the same binary gives the same image digest.
func BuildImage(ctx context.Context, pkg, ref, outDir string) (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	name := path.Base(pkg)
	if err := os.MkdirAll(outDir, 0o755); err != nil {
		return "", fmt.Errorf("building image %s: %w", ref, err)
	}
	work, err := os.MkdirTemp(outDir, ".build-"+name+"-")
	if err != nil {
		return "", fmt.Errorf("building image %s: %w", ref, err)
	}
	defer os.RemoveAll(work)

	binPath := filepath.Join(work, name)
	cmd := exec.CommandContext(ctx, "go", "build", "-trimpath", "-ldflags=-s -w", "-o", binPath, pkg)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("building image %s: go build %s: %w\n%s", ref, pkg, err, out)
	}
	bin, err := os.ReadFile(binPath)
	if err != nil {
		return "", fmt.Errorf("building image %s: %w", ref, err)
	}

	layer, err := singleFileLayer(name, bin)
	if err != nil {
		return "", fmt.Errorf("building image %s: %w", ref, err)
	}
	layerSum := sha256.Sum256(layer)
	layerID := hex.EncodeToString(layerSum[:])
	epoch := time.Unix(0, 0).UTC()
	config, err := json.Marshal(map[string]any{
		"architecture": runtime.GOARCH,
		"os":           "linux",
		"created":      epoch,
		"config": map[string]any{
			"Entrypoint": []string{"/" + name},
			"Env":        []string{"PATH=/"},
			"WorkingDir": "/",
		},
		"rootfs": map[string]any{
			"type":     "layers",
			"diff_ids": []string{"sha256:" + layerID},
		},
		"history": []map[string]any{{"created": epoch, "created_by": "gpulink test/localcluster.BuildImage " + pkg}},
	})
	if err != nil {
		return "", fmt.Errorf("building image %s: encoding config: %w", ref, err)
	}
	configSum := sha256.Sum256(config)
	configName := hex.EncodeToString(configSum[:]) + ".json"
	manifest, err := json.Marshal([]map[string]any{{
		"Config":   configName,
		"RepoTags": []string{ref},
		"Layers":   []string{layerID + "/layer.tar"},
	}})
	if err != nil {
		return "", fmt.Errorf("building image %s: encoding manifest: %w", ref, err)
	}

	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{layerID + "/layer.tar", layer},
		{configName, config},
		{"manifest.json", manifest},
	} {
		if err := writeTarFile(tw, f.name, 0o644, f.data); err != nil {
			return "", fmt.Errorf("building image %s: %w", ref, err)
		}
	}
	if err := tw.Close(); err != nil {
		return "", fmt.Errorf("building image %s: %w", ref, err)
	}
	tmp := filepath.Join(work, name+".tar")
	if err := os.WriteFile(tmp, archive.Bytes(), 0o644); err != nil {
		return "", fmt.Errorf("building image %s: %w", ref, err)
	}
	dst := filepath.Join(outDir, name+".tar")
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("building image %s: %w", ref, err)
	}
	return dst, nil
}

// singleFileLayer returns an uncompressed layer tar holding only the
// executable /<name>.
func singleFileLayer(name string, bin []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := writeTarFile(tw, name, 0o755, bin); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("writing layer: %w", err)
	}
	return buf.Bytes(), nil
}

func writeTarFile(tw *tar.Writer, name string, mode int64, data []byte) error {
	hdr := &tar.Header{
		Typeflag: tar.TypeReg,
		Name:     name,
		Mode:     mode,
		Size:     int64(len(data)),
		ModTime:  time.Unix(0, 0),
		Format:   tar.FormatUSTAR,
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("writing %s to tar: %w", name, err)
	}
	if _, err := tw.Write(data); err != nil {
		return fmt.Errorf("writing %s to tar: %w", name, err)
	}
	return nil
}
