//go:build integration

package monitoring_test

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"

	"github.com/gpulink/gpulink/test/localcluster"
)

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
	if err := cluster.InstallServiceMonitorCRD(ctx); err != nil {
		t.Fatal(err)
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
	created, err := dyn.Resource(localcluster.ServiceMonitorGVR).Namespace(ns).Create(ctx, sm, metav1.CreateOptions{FieldValidation: "Strict"})
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
		_, err := dyn.Resource(localcluster.ServiceMonitorGVR).Namespace(ns).Create(ctx, bad, metav1.CreateOptions{FieldValidation: "Strict"})
		if err == nil {
			t.Errorf("%s: a ServiceMonitor the CRD forbids was accepted: the check would not catch a broken template", name)
		} else if !apierrors.IsInvalid(err) && !apierrors.IsBadRequest(err) && !strings.Contains(err.Error(), "unknown field") {
			t.Errorf("%s: refused for another reason: %v", name, err)
		}
	}
}
