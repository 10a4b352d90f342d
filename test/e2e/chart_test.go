//go:build e2e

package e2e_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
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
	// chartKubeVersion is what hack/helm.sh renders the chart for.
	chartKubeVersion = "v1.37.0"
	// ungatedLabel on a namespace keeps the scheduling-gate policy away
	// from its pods: the test renders the chart with a
	// gate.namespaceSelector that excludes such namespaces.
	ungatedLabel = "e2e.gpulink.dev/gate"
	ungatedValue = "off"
)

// chartObjects are the cluster-scoped objects of one chart rendering.
type chartObjects struct {
	deviceClasses []resourceapi.DeviceClass
	policies      []admissionv1.MutatingAdmissionPolicy
	bindings      []admissionv1.MutatingAdmissionPolicyBinding
}

// renderChart renders the DeviceClasses and the scheduling-gate policy of
// the Helm chart with binDir/helm, as `helm template` would for a user,
// with the extra helm arguments.
func renderChart(ctx context.Context, root, binDir string, extra ...string) (*chartObjects, error) {
	helm := filepath.Join(binDir, "helm")
	if _, err := os.Stat(helm); err != nil {
		return nil, fmt.Errorf("%w: build helm first: `hack/helm.sh --build` (`make helm`, `make helm-lint`; `make test` and `make test-integration` do it before the e2e tests)", err)
	}
	args := append([]string{"template", "gpulink", filepath.Join(root, "deployments", "helm", "gpulink"),
		"--namespace", chartNamespace, "--kube-version", chartKubeVersion,
		"--show-only", "templates/deviceclasses.yaml",
		"--show-only", "templates/scheduling-gate.yaml",
	}, extra...)
	cmd := exec.CommandContext(ctx, helm, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("helm %v: %w\n%s", args, err, stderr.String())
	}
	objs := &chartObjects{}
	for _, doc := range yamlDocs(out) {
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("chart rendering: %w", err)
		}
		var target any
		switch meta.Kind {
		case "DeviceClass":
			objs.deviceClasses = append(objs.deviceClasses, resourceapi.DeviceClass{})
			target = &objs.deviceClasses[len(objs.deviceClasses)-1]
		case "MutatingAdmissionPolicy":
			objs.policies = append(objs.policies, admissionv1.MutatingAdmissionPolicy{})
			target = &objs.policies[len(objs.policies)-1]
		case "MutatingAdmissionPolicyBinding":
			objs.bindings = append(objs.bindings, admissionv1.MutatingAdmissionPolicyBinding{})
			target = &objs.bindings[len(objs.bindings)-1]
		default:
			return nil, fmt.Errorf("chart rendering: unexpected %s %s", meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), target); err != nil {
			return nil, fmt.Errorf("chart rendering, %s: %w", meta.Kind, err)
		}
	}
	if len(objs.deviceClasses) == 0 || len(objs.policies) != 1 || len(objs.bindings) != 1 {
		return nil, fmt.Errorf("chart rendering holds %d DeviceClasses, %d MutatingAdmissionPolicies and %d bindings; want the classes and one policy with its binding (gate.enabled, deviceClasses.enabled)",
			len(objs.deviceClasses), len(objs.policies), len(objs.bindings))
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

// install creates the rendered objects.
func (o *chartObjects) install(ctx context.Context, client kubernetes.Interface) error {
	for i := range o.deviceClasses {
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, &o.deviceClasses[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating DeviceClass %s: %w", o.deviceClasses[i].Name, err)
		}
	}
	for i := range o.policies {
		if _, err := client.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, &o.policies[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating MutatingAdmissionPolicy %s: %w", o.policies[i].Name, err)
		}
	}
	for i := range o.bindings {
		if _, err := client.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Create(ctx, &o.bindings[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating MutatingAdmissionPolicyBinding %s: %w", o.bindings[i].Name, err)
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
