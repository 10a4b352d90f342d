package localcluster

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/yaml"
)

// ChartObjects are the typed objects of a chart rendering (HelmTemplate
// with --show-only) that the suites install themselves: the DeviceClasses,
// the scheduling-gate policy and the translation webhook's objects.
type ChartObjects struct {
	DeviceClasses []resourceapi.DeviceClass
	Policies      []admissionv1.MutatingAdmissionPolicy
	Bindings      []admissionv1.MutatingAdmissionPolicyBinding
	Secrets       []corev1.Secret
	ConfigMaps    []corev1.ConfigMap
	Webhooks      []admissionv1.MutatingWebhookConfiguration
}

// DecodeChart decodes rendered YAML strictly (a field the type does not
// know is an error) into ChartObjects. Documents of comments only are
// skipped; an object of another kind is an error naming it.
func DecodeChart(rendered []byte) (*ChartObjects, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(rendered)))
	o := &ChartObjects{}
	for {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			return o, nil
		}
		if err != nil {
			return nil, fmt.Errorf("localcluster: chart rendering: %w", err)
		}
		var meta metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &meta); err != nil {
			return nil, fmt.Errorf("localcluster: chart rendering: %w", err)
		}
		var target any
		switch meta.Kind {
		case "":
			continue
		case "DeviceClass":
			target = appendNew(&o.DeviceClasses)
		case "MutatingAdmissionPolicy":
			target = appendNew(&o.Policies)
		case "MutatingAdmissionPolicyBinding":
			target = appendNew(&o.Bindings)
		case "Secret":
			target = appendNew(&o.Secrets)
		case "ConfigMap":
			target = appendNew(&o.ConfigMaps)
		case "MutatingWebhookConfiguration":
			target = appendNew(&o.Webhooks)
		default:
			return nil, fmt.Errorf("localcluster: chart rendering: unexpected %s %s", meta.APIVersion, meta.Kind)
		}
		if err := yaml.UnmarshalStrict(doc, target); err != nil {
			return nil, fmt.Errorf("localcluster: chart rendering, %s: %w", meta.Kind, err)
		}
	}
}

// appendNew appends a zero object to list and returns it to decode into.
func appendNew[T any](list *[]T) *T {
	var zero T
	*list = append(*list, zero)
	return &(*list)[len(*list)-1]
}

// InstallClusterScoped creates the DeviceClasses, policies and bindings
// (the webhook is left to the caller: its failurePolicy would refuse pods
// until its server runs).
func (o *ChartObjects) InstallClusterScoped(ctx context.Context, client kubernetes.Interface) error {
	for i := range o.DeviceClasses {
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, &o.DeviceClasses[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating DeviceClass %s: %w", o.DeviceClasses[i].Name, err)
		}
	}
	for i := range o.Policies {
		if _, err := client.AdmissionregistrationV1().MutatingAdmissionPolicies().Create(ctx, &o.Policies[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating MutatingAdmissionPolicy %s: %w", o.Policies[i].Name, err)
		}
	}
	for i := range o.Bindings {
		if _, err := client.AdmissionregistrationV1().MutatingAdmissionPolicyBindings().Create(ctx, &o.Bindings[i], metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("creating MutatingAdmissionPolicyBinding %s: %w", o.Bindings[i].Name, err)
		}
	}
	return nil
}
