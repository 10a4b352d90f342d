package localcluster

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
)

// PrometheusOperator is the Prometheus Operator release whose
// ServiceMonitor CRD the chart's ServiceMonitor is checked against and
// installed with. The CRD is read from the release's Go module (the module
// proxy serves its files), never copied into the project.
const (
	PrometheusOperator = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	serviceMonitorCRD  = "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
)

var (
	crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	// ServiceMonitorGVR is the resource of the Prometheus Operator's
	// ServiceMonitors.
	ServiceMonitorGVR = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"}
)

// ServiceMonitorCRD downloads PrometheusOperator's module (go mod
// download, outside any module so that the project's go.mod is not
// touched) and returns its ServiceMonitor CustomResourceDefinition.
func ServiceMonitorCRD(ctx context.Context) (*unstructured.Unstructured, error) {
	dir, err := os.MkdirTemp("", "gl-crd-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", PrometheusOperator)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=on")
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go mod download %s (needs the Go module proxy): %w\n%s", PrometheusOperator, err, out)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Error != "" || mod.Dir == "" {
		return nil, fmt.Errorf("go mod download %s: %v %s\n%s", PrometheusOperator, err, mod.Error, out)
	}
	raw, err := os.ReadFile(filepath.Join(mod.Dir, serviceMonitorCRD))
	if err != nil {
		return nil, err
	}
	objs, err := DecodeObjects(raw)
	if err != nil || len(objs) != 1 || objs[0].GetKind() != "CustomResourceDefinition" {
		return nil, fmt.Errorf("%s of %s: want one CustomResourceDefinition, got %d objects (%v)", serviceMonitorCRD, PrometheusOperator, len(objs), err)
	}
	return objs[0], nil
}

// InstallServiceMonitorCRD creates ServiceMonitorCRD on the cluster (an
// existing one is kept) and waits until the API server serves it.
func (c *Cluster) InstallServiceMonitorCRD(ctx context.Context) error {
	crd, err := ServiceMonitorCRD(ctx)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(c.RESTConfig())
	if err != nil {
		return err
	}
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("installing the ServiceMonitor CRD: %w", err)
	}
	var last string
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			last = err.Error()
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, cond := range conds {
			if m, ok := cond.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		last = fmt.Sprintf("conditions %v", conds)
		return false, nil
	}); err != nil {
		return fmt.Errorf("the ServiceMonitor CRD %s is not established (%s): %w", crd.GetName(), last, err)
	}
	return nil
}
