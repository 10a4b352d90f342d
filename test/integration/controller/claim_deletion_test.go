//go:build integration

package controller_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/controller"
	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

// guardRelease is the release name the guard policy is rendered for: the
// controller's service account is then <namespace>/gpulink-controller.
const guardRelease = "gpulink"

// claimFinalizerGuard renders the chart's claim-finalizer-guard.yaml with
// the project's helm for release namespace ns, the binding limited to ns
// so that the other tests on the shared cluster run without it.
func claimFinalizerGuard(t testing.TB, ns string) (*admissionv1.ValidatingAdmissionPolicy, *admissionv1.ValidatingAdmissionPolicyBinding) {
	t.Helper()
	out, err := localcluster.HelmTemplate(context.Background(), guardRelease, ns, "--show-only", "templates/claim-finalizer-guard.yaml")
	if err != nil {
		t.Fatal(err)
	}
	dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(out), 4096)
	policy := &admissionv1.ValidatingAdmissionPolicy{}
	binding := &admissionv1.ValidatingAdmissionPolicyBinding{}
	for _, into := range []any{policy, binding} {
		if err := dec.Decode(into); err != nil {
			t.Fatalf("decoding the rendered guard policy: %v\n%s", err, out)
		}
	}
	if err := dec.Decode(&map[string]any{}); !errors.Is(err, io.EOF) {
		t.Fatalf("rendered more than the policy and its binding (%v):\n%s", err, out)
	}
	binding.Spec.MatchResources = &admissionv1.MatchResources{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": ns}}}
	return policy, binding
}

// installClaimFinalizerGuard installs the guard for the env's namespace and
// waits until it refuses probe's finalizer removal by as (a dry run).
func (e *env) installClaimFinalizerGuard(as kubernetes.Interface, probe *resourceapi.ResourceClaim) {
	t := e.t
	t.Helper()
	policy, binding := claimFinalizerGuard(t, e.ns)
	adm := e.client.AdmissionregistrationV1()
	if _, err := adm.ValidatingAdmissionPolicies().Create(e.ctx, policy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.AdmissionregistrationV1().ValidatingAdmissionPolicies().Delete(e.ctx, policy.Name, metav1.DeleteOptions{})
	})
	if _, err := adm.ValidatingAdmissionPolicyBindings().Create(e.ctx, binding, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = e.client.AdmissionregistrationV1().ValidatingAdmissionPolicyBindings().Delete(e.ctx, binding.Name, metav1.DeleteOptions{})
	})
	e.poll("claim finalizer guard in effect", time.Minute, func() bool {
		return apierrors.IsForbidden(removeFinalizer(e, as, probe.Name, true))
	})
}

// namespaceUser returns a client with a token of a new service account of
// the env's namespace that holds the edit ClusterRole there: what a
// namespace's users usually get.
func (e *env) namespaceUser(name string) kubernetes.Interface {
	t := e.t
	t.Helper()
	if _, err := e.client.CoreV1().ServiceAccounts(e.ns).Create(e.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	rb := &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: name + "-edit"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "edit"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: e.ns}},
	}
	if _, err := e.client.RbacV1().RoleBindings(e.ns).Create(e.ctx, rb, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tr, err := e.client.CoreV1().ServiceAccounts(e.ns).CreateToken(e.ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rest.AnonymousClientConfig(cluster.RESTConfig())
	cfg.BearerToken = tr.Status.Token
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// The RoleBinding takes effect once the authorizer's cache has it.
	e.poll("edit role of "+name+" in effect", time.Minute, func() bool {
		_, err := c.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
		return err == nil
	})
	return c
}

// removeFinalizer removes gpulink's finalizer from a claim as client.
func removeFinalizer(e *env, client kubernetes.Interface, name string, dryRun bool) error {
	// kube-controller-manager may write the claim meanwhile (it clears the
	// reservations of pods that are gone): read again on a conflict, as a
	// user's kubectl edit would.
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		c.Finalizers = slices.DeleteFunc(c.Finalizers, func(f string) bool { return f == driver.ClaimFinalizer })
		opts := metav1.UpdateOptions{}
		if dryRun {
			opts.DryRun = []string{metav1.DryRunAll}
		}
		_, err = client.ResourceV1().ResourceClaims(e.ns).Update(e.ctx, c, opts)
		return err
	})
}

// TestClaimFinalizerGuard installs the chart's claim-finalizer-guard
// policy for one namespace and tries it with real service-account tokens:
// a namespace user (edit role) cannot remove gpulink's finalizer from a
// claim a bound pod reserves, by update or by patch, and is told which
// pods to delete; other updates and the deletion itself are allowed; the
// controller's service account may remove it; kube-controller-manager
// still clears the reservations of pods that are gone, even with no gpulink
// controller running, and the user may then remove the finalizer, so no
// claim stays stuck.
func TestClaimFinalizerGuard(t *testing.T) {
	e := setup(t, map[string]string{"guard-p4": "pcie-4.txt"})
	ctrl := e.startController(2)
	e.template("one", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	a := e.startBound(e.newPod("a", true, "one"), time.Minute)
	claim := e.claimsOf(a)[0]
	if !slices.Contains(claim.Finalizers, driver.ClaimFinalizer) || len(claim.Status.ReservedFor) != 1 {
		t.Fatalf("claim %s: finalizers %v, reservedFor %v", claim.Name, claim.Finalizers, claim.Status.ReservedFor)
	}
	user := e.namespaceUser("tenant")
	e.installClaimFinalizerGuard(user, claim)

	err := removeFinalizer(e, user, claim.Name, false)
	if !apierrors.IsForbidden(err) {
		t.Fatalf("namespace user removed the finalizer of claim %s reserved by a bound pod: err %v, want Forbidden", claim.Name, err)
	}
	for _, want := range []string{e.ns + "/" + claim.Name, "pod a", "Delete the pods first", "kubectl delete pod -n " + e.ns + " a"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err.Error(), want)
		}
	}
	patch := []byte(`{"metadata":{"finalizers":null}}`)
	if _, err := user.ResourceV1().ResourceClaims(e.ns).Patch(e.ctx, claim.Name, types.MergePatchType, patch, metav1.PatchOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("namespace user dropped all finalizers by merge patch: err %v, want Forbidden", err)
	}
	// Updates that keep the finalizer are none of the policy's business.
	labelled, err := user.ResourceV1().ResourceClaims(e.ns).Patch(e.ctx, claim.Name, types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"x"}}}`), metav1.PatchOptions{})
	if err != nil {
		t.Errorf("namespace user could not label the claim: %v", err)
	} else if !slices.Contains(labelled.Finalizers, driver.ClaimFinalizer) {
		t.Errorf("finalizers after labelling: %v", labelled.Finalizers)
	}
	// The controller's service account is exempt (a dry run: the
	// controller itself only removes it once reservedFor is empty).
	sa := e.namespaceUser(guardRelease + "-controller")
	if err := removeFinalizer(e, sa, claim.Name, true); err != nil {
		t.Errorf("the controller's service account may not remove the finalizer: %v", err)
	}
	// Deleting is allowed; the claim waits for its pod.
	if err := user.ResourceV1().ResourceClaims(e.ns).Delete(e.ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("namespace user could not delete the claim: %v", err)
	}
	if c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, claim.Name, metav1.GetOptions{}); err != nil || c.DeletionTimestamp == nil || c.Status.Allocation == nil {
		t.Fatalf("deleted claim in use: %v (err %v), want it kept, allocated, marked for deletion", c, err)
	}
	if err := user.CoreV1().Pods(e.ns).Delete(e.ctx, "a", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	e.poll("claim gone with its pod", time.Minute, func() bool {
		_, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, claim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	// With no gpulink controller (stopped, or uninstalled without its
	// policy being gone yet), a claim whose pod is gone is unreserved by
	// kube-controller-manager, and its owner may then remove the finalizer.
	b := e.startBound(e.newPod("b", true, "one"), time.Minute)
	claim = e.claimsOf(b)[0]
	ctrl.stop()
	if err := removeFinalizer(e, user, claim.Name, false); !apierrors.IsForbidden(err) {
		t.Fatalf("finalizer of reserved claim %s removed: err %v, want Forbidden", claim.Name, err)
	}
	if err := user.CoreV1().Pods(e.ns).Delete(e.ctx, "b", metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)}); err != nil {
		t.Fatal(err)
	}
	e.poll("kube-controller-manager unreserves the claim of the deleted pod", time.Minute, func() bool {
		c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, claim.Name, metav1.GetOptions{})
		return err == nil && len(c.Status.ReservedFor) == 0
	})
	if err := removeFinalizer(e, user, claim.Name, false); err != nil {
		t.Errorf("owner could not remove the finalizer of an unreserved claim: %v", err)
	}
	e.poll("claim gone", time.Minute, func() bool {
		_, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, claim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
}

// setPhase sets a pod's phase as its kubelet would (the nodes here are
// API objects only).
func (e *env) setPhase(name string, phase corev1.PodPhase) {
	e.t.Helper()
	p, err := e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	p.Status.Phase = phase
	if _, err := e.client.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

// waitNotPlaced waits until pod is decided: the controller says it waits,
// or kube-scheduler says it is unschedulable; placed first fails the test.
func (e *env) waitNotPlaced(name string, held []string) {
	e.t.Helper()
	var p *corev1.Pod
	e.poll("pod "+name+" decided", time.Minute, func() bool {
		var err error
		p, err = e.client.CoreV1().Pods(e.ns).Get(e.ctx, name, metav1.GetOptions{})
		if err != nil {
			return false
		}
		if p.Spec.NodeName != "" || hasEvent(e.events(name, p.UID), "waiting: ") {
			return true
		}
		for _, c := range p.Status.Conditions {
			if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
				return true
			}
		}
		return false
	})
	if p.Spec.NodeName != "" {
		var got []string
		for _, c := range e.claimsOf(p) {
			got = append(got, devicesOfClaim(c)...)
		}
		e.t.Fatalf("pod %s got %v while the pod whose claim was deleted still runs on %v", name, got, held)
	}
}

func devicesOfClaim(c *resourceapi.ResourceClaim) []string {
	if c.Status.Allocation == nil {
		return nil
	}
	var out []string
	for _, r := range c.Status.Allocation.Devices.Results {
		out = append(out, r.Device)
	}
	return out
}

// TestDeletedClaimKeepsGPUs is the controller's defence where the guard
// policy is absent: an admin (or a user where nothing refuses it) removes
// gpulink's finalizer from a claim a running pod reserves and deletes it.
// Neither the controller's next tenant nor kube-scheduler's (an ungated
// pod whose claim tolerates the managed taint) gets those GPUs, also
// after a controller restart, until the pod finishes; then the
// controller's tenants do.
func TestDeletedClaimKeepsGPUs(t *testing.T) {
	e := setup(t, map[string]string{"hold-p4": "pcie-4.txt"})
	ctrl := e.startController(2)
	defer func() { ctrl.stop() }()
	e.template("four", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 4)}})
	e.template("one", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}})
	stock := controllertest.WholeRequest("g", 1)
	stock.Exactly.Tolerations = []resourceapi.DeviceToleration{{Key: driver.ManagedTaintKey, Operator: resourceapi.DeviceTolerationOpExists, Effect: resourceapi.DeviceTaintEffectNoSchedule}}
	e.template("stock", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{stock}})

	a := e.startBound(e.newPod("a", true, "four"), time.Minute)
	e.setPhase("a", corev1.PodRunning)
	claim := e.claimsOf(a)[0]
	held := devicesOfClaim(claim)
	claim.Finalizers = nil
	if _, err := e.client.ResourceV1().ResourceClaims(e.ns).Update(e.ctx, claim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.client.ResourceV1().ResourceClaims(e.ns).Delete(e.ctx, claim.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("claim gone", 30*time.Second, func() bool {
		_, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, claim.Name, metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})

	// The controller's next tenant waits.
	e.createPod(e.newPod("b", true, "one"))
	e.waitNotPlaced("b", held)
	e.poll("event on pod a about its deleted claim", 30*time.Second, func() bool { return hasEvent(e.events("a", a.UID), "stay counted") })

	// kube-scheduler allocates for itself; it counts the hold record.
	e.poll("hold record of the deleted claim", 30*time.Second, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: controller.HoldLabel + "=true"})
		return err == nil && len(l.Items) == 1 && l.Items[0].Status.Allocation != nil
	})
	e.createPod(e.newPod("c", false, "stock"))
	e.waitNotPlaced("c", held)

	// A restarted controller still counts them.
	ctrl.stop()
	ctrl = e.startController(2)
	e.createPod(e.newPod("d", true, "one"))
	e.waitNotPlaced("d", held)
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}

	// kube-scheduler's pod goes first: once the GPUs are free, it and the
	// controller would allocate them at the same moment, each unseen by
	// the other (two allocators; the kubelet plugin refuses the loser's
	// prepare), which is not what this test is about.
	e.deletePod("c")

	// Once the pod finishes, the waiting pods get GPUs pod a had.
	e.setPhase("a", corev1.PodSucceeded)
	for _, name := range []string{"b", "d"} {
		p := e.waitBound(name, 2*time.Minute)
		for _, c := range e.claimsOf(p) {
			for _, d := range devicesOfClaim(c) {
				if !slices.Contains(held, d) {
					t.Errorf("pod %s got %s, not one of %v", name, d, held)
				}
			}
		}
	}
	e.poll("hold record deleted", 30*time.Second, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: controller.HoldLabel + "=true"})
		return err == nil && len(l.Items) == 0
	})
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
}
