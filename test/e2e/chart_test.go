//go:build e2e

package e2e_test

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

const (
	// chartNamespace is the namespace the chart is rendered for; the
	// objects the test applies are cluster-scoped.
	chartNamespace = "gpulink-system"
	// ungatedLabel on a namespace keeps the scheduling-gate policy away
	// from its pods: the test renders the chart with a
	// gate.namespaceSelector that excludes such namespaces.
	ungatedLabel = "e2e.gpulink.dev/gate"
	ungatedValue = "off"
)

// renderChart renders the DeviceClasses and the scheduling-gate policy of
// the Helm chart as `helm template` would for a user, with the extra helm
// arguments.
func renderChart(ctx context.Context, extra ...string) (*localcluster.ChartObjects, error) {
	out, err := localcluster.HelmTemplate(ctx, "gpulink", chartNamespace, append([]string{
		"--show-only", "templates/deviceclasses.yaml",
		"--show-only", "templates/scheduling-gate.yaml",
	}, extra...)...)
	if err != nil {
		return nil, err
	}
	objs, err := localcluster.DecodeChart(out)
	if err != nil {
		return nil, err
	}
	if n := len(objs.Secrets) + len(objs.ConfigMaps) + len(objs.Webhooks); n > 0 {
		return nil, fmt.Errorf("chart rendering: %d objects besides the DeviceClasses and the gate policy", n)
	}
	if len(objs.DeviceClasses) == 0 || len(objs.Policies) != 1 || len(objs.Bindings) != 1 {
		return nil, fmt.Errorf("chart rendering holds %d DeviceClasses, %d MutatingAdmissionPolicies and %d bindings; want the classes and one policy with its binding (gate.enabled, deviceClasses.enabled)",
			len(objs.DeviceClasses), len(objs.Policies), len(objs.Bindings))
	}
	return objs, nil
}

// sameDeviceClasses checks that the chart's DeviceClasses are those of the
// plain manifest: same names, labels (the chart adds its own) and specs.
func sameDeviceClasses(chart, file []resourceapi.DeviceClass) error {
	if len(chart) != len(file) {
		return fmt.Errorf("the chart has %d DeviceClasses, the manifest %d", len(chart), len(file))
	}
	for i := range file {
		c, f := chart[i], file[i]
		if c.Name != f.Name {
			return fmt.Errorf("DeviceClass %d: %s in the chart, %s in the manifest", i, c.Name, f.Name)
		}
		for k, v := range f.Labels {
			if got, ok := c.Labels[k]; !ok || got != v {
				return fmt.Errorf("DeviceClass %s: label %s=%q in the manifest, %q in the chart (set: %t)", f.Name, k, v, got, ok)
			}
		}
		if !apiequality.Semantic.DeepEqual(c.Spec, f.Spec) {
			chartSpec, _ := yaml.Marshal(c.Spec)
			fileSpec, _ := yaml.Marshal(f.Spec)
			return fmt.Errorf("DeviceClass %s: spec differs between the chart and the manifest\nchart:\n%s\nmanifest:\n%s", f.Name, chartSpec, fileSpec)
		}
	}
	return nil
}

// gated reports how often the pod carries gpulink's scheduling gate.
func gated(pod *corev1.Pod) int {
	n := 0
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == driver.SchedulingGate {
			n++
		}
	}
	return n
}

// probePod is a pod with a resource claim, for dry-run creates.
func probePod() *corev1.Pod {
	template := "gate-probe"
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "gate-probe"},
		Spec: corev1.PodSpec{
			ResourceClaims: []corev1.PodResourceClaim{{Name: "gpus", ResourceClaimTemplateName: &template}},
			Containers: []corev1.Container{{
				Name:      "probe",
				Image:     localcluster.WorkloadImage,
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpus"}}},
			}},
		},
	}
}

// waitGatePolicy waits until the API server applies the scheduling-gate
// policy (it picks up new policies and bindings asynchronously): until a
// pod with a claim, created as a server-side dry run in namespace, comes
// back gated.
func waitGatePolicy(ctx context.Context, client kubernetes.Interface, namespace string) error {
	var last string
	err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		pod, err := client.CoreV1().Pods(namespace).Create(ctx, probePod(), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err.Error()
			// A policy that has just been registered may fail its first
			// evaluations; failurePolicy Fail then rejects the pod.
			return false, nil
		}
		last = fmt.Sprintf("dry-run pod came back with gates %v", pod.Spec.SchedulingGates)
		return gated(pod) == 1, nil
	})
	if err != nil {
		return fmt.Errorf("the scheduling-gate policy never took effect in namespace %s (last: %s): %w", namespace, last, err)
	}
	return nil
}

// ungatedNamespace creates a namespace the gate policy leaves alone, with
// its default service account (pods need it to be admitted).
func ungatedNamespace(ctx context.Context, client kubernetes.Interface, name string) error {
	_, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{ungatedLabel: ungatedValue},
	}}, metav1.CreateOptions{})
	if err != nil {
		return fmt.Errorf("creating namespace %s: %w", name, err)
	}
	_, err = client.CoreV1().ServiceAccounts(name).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating the default service account of %s: %w", name, err)
	}
	return nil
}
