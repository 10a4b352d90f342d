//go:build integration

package scale_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/kubeclient"
)

// env is the test's namespace on the cluster.
type env struct {
	t      testing.TB
	ctx    context.Context
	client kubernetes.Interface
	ns     string
}

// setup creates a namespace and gpulink's DeviceClasses.
func setup(t testing.TB) *env {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	cfg := cluster.RESTConfig()
	cfg.QPS, cfg.Burst = 2000, 4000
	// As kube-scheduler and kube-controller-manager: an observer that
	// made the API server encode every watch event as JSON as well would
	// be measured with either path.
	if err := kubeclient.SetContentType(cfg, kubeclient.DefaultContentType); err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, ctx: ctx, client: client, ns: fmt.Sprintf("s-%d", rand.IntN(1_000_000))}
	for _, c := range planner.DeviceClasses() {
		if _, err := client.ResourceV1().DeviceClasses().Create(ctx, c, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	if _, err := client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: e.ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("service account "+e.ns+"/default", time.Minute, func() bool {
		_, err := client.CoreV1().ServiceAccounts(e.ns).Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	})
	return e
}

func (e *env) poll(what string, timeout time.Duration, cond func() bool) {
	e.t.Helper()
	err := wait.PollUntilContextTimeout(e.ctx, 50*time.Millisecond, timeout, true, func(context.Context) (bool, error) { return cond(), nil })
	if err != nil {
		e.t.Fatalf("timed out after %s waiting for %s", timeout, what)
	}
}

// template creates a ResourceClaimTemplate.
func (e *env) template(name string, spec resourceapi.DeviceClaim) {
	e.t.Helper()
	tpl := &resourceapi.ResourceClaimTemplate{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: resourceapi.ResourceClaimTemplateSpec{Spec: resourceapi.ResourceClaimSpec{Devices: spec}}}
	if _, err := e.client.ResourceV1().ResourceClaimTemplates(e.ns).Create(e.ctx, tpl, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// newPod returns a pod with one claim from the template, gated as the
// chart's admission policy gates it.
func (e *env) newPod(name, template string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: e.ns},
		Spec: corev1.PodSpec{
			Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10",
				Resources: corev1.ResourceRequirements{Claims: []corev1.ResourceClaim{{Name: "gpu"}}}}},
			ResourceClaims:                []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(template)}},
			SchedulingGates:               []corev1.PodSchedulingGate{{Name: driver.SchedulingGate}},
			TerminationGracePeriodSeconds: ptr.To[int64](0),
		},
	}
}

func (e *env) checkInvariants() error {
	return controllertest.CheckClusterInvariants(e.ctx, e.client)
}
