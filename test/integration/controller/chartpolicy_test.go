//go:build integration

package controller_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"strconv"
	"strings"
	"testing"
	"text/template"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/driver"
)

// chartPolicy renders one of the chart's MutatingAdmissionPolicy templates
// with the few template functions they use (no helm needed) and returns
// the policy and its binding, the binding limited to namespace ns so that
// the other tests on the shared cluster keep running without the policy.
func chartPolicy(t testing.TB, file, ns string, values map[string]any) (*admissionv1.MutatingAdmissionPolicy, *admissionv1.MutatingAdmissionPolicyBinding) {
	t.Helper()
	raw, err := os.ReadFile("../../../deployments/helm/gpulink/templates/" + file)
	if err != nil {
		t.Fatal(err)
	}
	funcs := template.FuncMap{
		"include": func(name string, _ any) string {
			switch name {
			case "gpulink.fullname":
				return "gl-" + ns
			case "gpulink.schedulingGate":
				return driver.SchedulingGate
			}
			return "labels: {}"
		},
		"toJson": func(v any) string { b, _ := json.Marshal(v); return string(b) },
		"toYaml": func(v any) string { b, _ := yaml.Marshal(v); return strings.TrimSpace(string(b)) },
		"quote":  strconv.Quote,
		"list":   func(v ...any) []any { return v },
		"dict":   func(...any) map[string]any { return nil },
		"concat": func(a []any, b []any) []any { return append(append([]any{}, a...), b...) },
		"append": func(a []any, v any) []any { return append(append([]any{}, a...), v) },
		"nindent": func(n int, s string) string {
			return "\n" + strings.Repeat(" ", n) + strings.ReplaceAll(s, "\n", "\n"+strings.Repeat(" ", n))
		},
	}
	tpl, err := template.New(file).Funcs(funcs).Parse(string(raw))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := tpl.Execute(&out, map[string]any{"Values": values}); err != nil {
		t.Fatal(err)
	}
	docs := strings.Split(out.String(), "\n---\n")
	if len(docs) != 2 {
		t.Fatalf("%s rendered %d documents, want policy and binding:\n%s", file, len(docs), out.String())
	}
	policy := &admissionv1.MutatingAdmissionPolicy{}
	binding := &admissionv1.MutatingAdmissionPolicyBinding{}
	if err := yaml.UnmarshalStrict([]byte(docs[0]), policy); err != nil {
		t.Fatalf("%s policy: %v\n%s", file, err, docs[0])
	}
	if err := yaml.UnmarshalStrict([]byte(docs[1]), binding); err != nil {
		t.Fatalf("%s binding: %v\n%s", file, err, docs[1])
	}
	binding.Spec.MatchResources = &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}
	return policy, binding
}

// installPolicy creates a policy and its binding, removed after the test.
func (e *env) installPolicy(policy *admissionv1.MutatingAdmissionPolicy, binding *admissionv1.MutatingAdmissionPolicyBinding) {
	t := e.t
	t.Helper()
	adm := e.client.AdmissionregistrationV1()
	if _, err := adm.MutatingAdmissionPolicies().Create(e.ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adm.MutatingAdmissionPolicies().Delete(context.Background(), policy.Name, metav1.DeleteOptions{})
	})
	if _, err := adm.MutatingAdmissionPolicyBindings().Create(e.ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = adm.MutatingAdmissionPolicyBindings().Delete(context.Background(), binding.Name, metav1.DeleteOptions{})
	})
}
