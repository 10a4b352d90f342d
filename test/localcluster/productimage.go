package localcluster

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// ProductImageRepo is the repository of the gpulink image that `make image`
// (hack/image.sh) builds; the tag is the caller's.
const ProductImageRepo = "gpulink.local/gpulink"

// BuildProductImage builds the gpulink image (all binaries, glibc, CA
// certificates; see hack/image.sh) tagged ProductImageRepo:tag and returns
// its reference and the docker-archive tar under _output/image, ready for
// (*Cluster).ImportImage. The Debian packages are cached under
// _output/image/cache, the binaries in the Go build cache, so a second call
// takes seconds.
func BuildProductImage(ctx context.Context, tag string) (ref, tarPath string, err error) {
	if tag == "" || strings.ContainsAny(tag, "/: ") {
		return "", "", fmt.Errorf("localcluster: image tag %q: want a non-empty tag without '/', ':' or spaces", tag)
	}
	root, err := RepoRoot()
	if err != nil {
		return "", "", err
	}
	cmd := exec.CommandContext(ctx, filepath.Join(root, "hack", "image.sh"))
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "IMAGE_REPO="+ProductImageRepo, "IMAGE_TAG="+tag)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", "", fmt.Errorf("localcluster: hack/image.sh (tag %s): %w\n%s", tag, err, stderr.String())
	}
	// The script's only stdout line: "<ref> <tar>".
	f := strings.Fields(stdout.String())
	if len(f) != 2 {
		return "", "", fmt.Errorf("localcluster: hack/image.sh printed %q, want \"<ref> <tar>\"", stdout.String())
	}
	if want := ProductImageRepo + ":" + tag; f[0] != want {
		return "", "", fmt.Errorf("localcluster: hack/image.sh built %s, want %s", f[0], want)
	}
	return f[0], f[1], nil
}
