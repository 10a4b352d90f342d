//go:build integration

package monitoring_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"

	"github.com/gpulink/gpulink/test/localcluster"
)

// prometheusOperator is the Prometheus Operator release whose
// ServiceMonitor CRD the chart's ServiceMonitor is checked against. The
// CRD is read from the release's Go module (the module proxy serves its
// files), never copied into the project.
const (
	prometheusOperator = "github.com/prometheus-operator/prometheus-operator@v0.85.0"
	serviceMonitorCRD  = "example/prometheus-operator-crd/monitoring.coreos.com_servicemonitors.yaml"
)

var (
	crdGVR            = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}
	serviceMonitorGVR = schema.GroupVersionResource{Group: "monitoring.coreos.com", Version: "v1", Resource: "servicemonitors"}
)

// operatorCRD downloads the operator's module (go mod download) and reads
// its ServiceMonitor CRD.
func operatorCRD(t *testing.T) *unstructured.Unstructured {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "mod", "download", "-json", prometheusOperator)
	// Outside any module: the download does not touch the project's go.mod.
	cmd.Dir = t.TempDir()
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GO111MODULE=on")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go mod download %s (needs the Go module proxy): %v\n%s", prometheusOperator, err, out)
	}
	var mod struct{ Dir, Error string }
	if err := json.Unmarshal(out, &mod); err != nil || mod.Error != "" || mod.Dir == "" {
		t.Fatalf("go mod download %s: %v %s\n%s", prometheusOperator, err, mod.Error, out)
	}
	raw, err := os.ReadFile(filepath.Join(mod.Dir, serviceMonitorCRD))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := localcluster.DecodeObjects(raw)
	if err != nil || len(objs) != 1 || objs[0].GetKind() != "CustomResourceDefinition" {
		t.Fatalf("%s: want one CustomResourceDefinition, got %d objects (%v)", serviceMonitorCRD, len(objs), err)
	}
	return objs[0]
}

// TestServiceMonitorMatchesOperatorCRD installs the Prometheus Operator's
// ServiceMonitor CRD on the live API server and creates the chart's
// ServiceMonitor (with its interval and the release label users add):
// the API server validates it against the CRD's schema. A ServiceMonitor
// the schema forbids is refused, so the check is real.
func TestServiceMonitorMatchesOperatorCRD(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dyn, err := dynamic.NewForConfig(cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	crd := operatorCRD(t)
	if _, err := dyn.Resource(crdGVR).Create(ctx, crd, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("installing the ServiceMonitor CRD: %v", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		got, err := dyn.Resource(crdGVR).Get(ctx, crd.GetName(), metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
		for _, c := range conds {
			if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	}); err != nil {
		t.Fatalf("the ServiceMonitor CRD is not established: %v", err)
	}

	const ns = "gpulink-monitoring"
	if _, err := cluster.Client().CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	out, err := localcluster.HelmTemplate(ctx, "gpulink", ns,
		"--set", "serviceMonitor.enabled=true", "--set", "serviceMonitor.interval=15s", "--set", "serviceMonitor.scrapeTimeout=10s",
		"--set", "serviceMonitor.labels.release=kube-prometheus-stack",
		"--show-only", "templates/servicemonitor.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := localcluster.DecodeObjects(out)
	if err != nil || len(objs) != 1 {
		t.Fatalf("rendered ServiceMonitor: %d objects (%v)\n%s", len(objs), err, out)
	}
	sm := objs[0]
	// Strict field validation: a field the CRD's schema does not know is
	// an error, not silently dropped.
	created, err := dyn.Resource(serviceMonitorGVR).Namespace(ns).Create(ctx, sm, metav1.CreateOptions{FieldValidation: "Strict"})
	if err != nil {
		t.Fatalf("the chart's ServiceMonitor is refused by the Prometheus Operator's CRD: %v\n%s", err, out)
	}
	eps, _, _ := unstructured.NestedSlice(created.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("stored ServiceMonitor has %d endpoints, want 1", len(eps))
	}
	ep := eps[0].(map[string]any)
	for k, want := range map[string]any{"port": "metrics", "path": "/metrics", "honorLabels": true, "interval": "15s", "scrapeTimeout": "10s"} {
		if ep[k] != want {
			t.Errorf("stored endpoint %s=%v, want %v", k, ep[k], want)
		}
	}

	for name, mutate := range map[string]func(*unstructured.Unstructured){
		"bad-interval": func(u *unstructured.Unstructured) {
			eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
			eps[0].(map[string]any)["interval"] = "every minute"
			_ = unstructured.SetNestedSlice(u.Object, eps, "spec", "endpoints")
		},
		"bad-field": func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "yes", "spec", "scrapeEverything")
		},
	} {
		bad := sm.DeepCopy()
		bad.SetName(name)
		mutate(bad)
		_, err := dyn.Resource(serviceMonitorGVR).Namespace(ns).Create(ctx, bad, metav1.CreateOptions{FieldValidation: "Strict"})
		if err == nil {
			t.Errorf("%s: a ServiceMonitor the CRD forbids was accepted: the check would not catch a broken template", name)
		} else if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) && !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s: refused for another reason: %v", name, err)
		}
	}
}
