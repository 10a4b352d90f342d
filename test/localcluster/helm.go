package localcluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
)

// ChartKubeVersion is the Kubernetes version tests render the chart for,
// as hack/helm.sh does.
const ChartKubeVersion = "v1.37.0"

// HelmTemplate renders the gpulink chart as `helm template RELEASE
// <chart> --namespace NAMESPACE` would for a user, with the project's
// helm ($GPULINK_BIN_DIR/helm) and the extra arguments (--set,
// --show-only, …), and returns the rendered YAML.
func HelmTemplate(ctx context.Context, release, namespace string, extra ...string) ([]byte, error) {
	binDir, err := DefaultBinDir()
	if err != nil {
		return nil, err
	}
	root, err := RepoRoot()
	if err != nil {
		return nil, err
	}
	helm := filepath.Join(binDir, "helm")
	if _, err := os.Stat(helm); err != nil {
		return nil, fmt.Errorf("%w: build helm first: `hack/helm.sh --build` (`make helm`; `make test` and `make test-integration` do it before these tests)", err)
	}
	args := append([]string{"template", release, filepath.Join(root, "deployments", "helm", "gpulink"),
		"--namespace", namespace, "--kube-version", ChartKubeVersion}, extra...)
	cmd := exec.CommandContext(ctx, helm, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %v: %w\n%s", args, err, stderr.String())
	}
	return out, nil
}

// DecodeObjects splits rendered YAML (HelmTemplate's output) into its
// objects, skipping empty documents.
func DecodeObjects(rendered []byte) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(rendered), 4096)
	var objs []*unstructured.Unstructured
	for {
		u := &unstructured.Unstructured{}
		if err := dec.Decode(&u.Object); err != nil {
			if errors.Is(err, io.EOF) {
				return objs, nil
			}
			return nil, fmt.Errorf("localcluster: decoding rendered objects: %w", err)
		}
		if len(u.Object) > 0 {
			objs = append(objs, u)
		}
	}
}
