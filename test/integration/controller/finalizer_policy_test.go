//go:build integration

package controller_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpulink/gpulink/controller/controllertest"
	"github.com/gpulink/gpulink/driver"
)

// claimFinalizerPolicy renders the chart's claim-finalizer template
// (chartPolicy), its binding limited to namespace ns.
func claimFinalizerPolicy(t testing.TB, ns string) (*admissionv1.MutatingAdmissionPolicy, *admissionv1.MutatingAdmissionPolicyBinding) {
	t.Helper()
	return chartPolicy(t, "claim-finalizer.yaml", ns, map[string]any{
		"controller":     map[string]any{"enabled": true},
		"claimFinalizer": map[string]any{"enabled": true, "extraDeviceClasses": []any{}},
		"deviceClasses":  map[string]any{"enabled": true, "concurrentShareClass": true},
	})
}

// installClaimFinalizerPolicy installs the chart's claim finalizer policy
// for the env's namespace and waits until it takes effect. It returns the
// claim it probed with (dry run).
func (e *env) installClaimFinalizerPolicy() *resourceapi.ResourceClaim {
	t := e.t
	t.Helper()
	e.installPolicy(claimFinalizerPolicy(t, e.ns))
	probe := &resourceapi.ResourceClaim{ObjectMeta: metav1.ObjectMeta{GenerateName: "probe-", Namespace: e.ns},
		Spec: resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 1)}}}}
	e.poll("claim finalizer policy in effect", time.Minute, func() bool {
		c, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(c.Finalizers) == 1 && c.Finalizers[0] == driver.ClaimFinalizer
	})
	return probe
}

// TestClaimFinalizerPolicy installs the chart's claim finalizer policy for
// one namespace: claims created from templates by kube-controller-manager
// carry gpulink's finalizer from creation, the controller allocates them
// without writing it (only the claim's status, seen in managedFields),
// and the invariants hold once the pods are gone.
func TestClaimFinalizerPolicy(t *testing.T) {
	e := setup(t, map[string]string{"mapol-v100": "v100-sxm2-8-aliyun-sccgn6.txt"})
	probe := e.installClaimFinalizerPolicy()

	ctrl := e.startController(4)
	defer ctrl.stop()
	e.template("pair", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.WholeRequest("g", 2)}})
	e.template("share", resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{controllertest.ShareRequest("s", "2Gi", "20")}})
	var names []string
	for i := range 6 {
		name := fmt.Sprintf("p%d", i)
		tpl := "pair"
		if i%2 == 1 {
			tpl = "share"
		}
		e.createPod(e.newPod(name, true, tpl))
		names = append(names, name)
	}
	for _, name := range names {
		p := e.waitBound(name, time.Minute)
		for _, c := range e.claimsOf(p) {
			if !slices.Contains(c.Finalizers, driver.ClaimFinalizer) {
				t.Errorf("claim %s: finalizers %v", c.Name, c.Finalizers)
			}
			for _, mf := range c.ManagedFields {
				if mf.Manager == "gpulink-controller" && mf.Subresource == "" {
					t.Errorf("claim %s: the controller wrote its metadata (%s), want only its status", c.Name, mf.Operation)
				}
			}
		}
	}
	// A claim naming a gpulink class by name but used by no pod loses the
	// finalizer again; so does one of another driver used by a pod.
	stray := probe.DeepCopy()
	stray.GenerateName, stray.Name = "", "stray"
	if _, err := e.client.ResourceV1().ResourceClaims(e.ns).Create(e.ctx, stray, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.poll("finalizer removed from a claim no pod uses", 30*time.Second, func() bool {
		c, err := e.client.ResourceV1().ResourceClaims(e.ns).Get(e.ctx, "stray", metav1.GetOptions{})
		return err == nil && len(c.Finalizers) == 0
	})
	for _, name := range names {
		e.deletePod(name)
	}
	e.poll("claims gone with their pods", time.Minute, func() bool {
		l, err := e.client.ResourceV1().ResourceClaims(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		for _, c := range l.Items {
			if c.Name != "stray" {
				return false
			}
		}
		return true
	})
	if err := e.checkInvariants(); err != nil {
		t.Error(err)
	}
	if err := e.client.ResourceV1().ResourceClaims(e.ns).Delete(e.ctx, "stray", metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
		t.Error(err)
	}
}
