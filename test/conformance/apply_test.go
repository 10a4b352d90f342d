//go:build e2e

package conformance_test

import (
	"context"
	"fmt"

	"os"
	"path/filepath"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
)

// resources maps the kinds the peer manifests hold to their API resources;
// a kind missing here fails the case naming the file.
var resources = map[string]schema.GroupVersionResource{
	"Namespace":             {Version: "v1", Resource: "namespaces"},
	"Pod":                   {Version: "v1", Resource: "pods"},
	"ResourceClaim":         {Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaims"},
	"ResourceClaimTemplate": {Group: "resource.k8s.io", Version: "v1", Resource: "resourceclaimtemplates"},
	"Deployment":            {Group: "apps", Version: "v1", Resource: "deployments"},
	"Job":                   {Group: "batch", Version: "v1", Resource: "jobs"},
	"DeviceTaintRule":       {Group: "resource.k8s.io", Version: "v1", Resource: "devicetaintrules"},
}

// clusterScoped kinds are created without a namespace; the case deletes
// them at cleanup (a DeviceTaintRule would taint the next cases' GPUs).
var clusterScoped = map[string]bool{"Namespace": true, "DeviceTaintRule": true}

// applyFile ports the documents of one peer file and creates them, in
// namespace ns where a document names none. Namespaces the file creates
// get the default service account pods need (the local cluster runs no
// service account controller for them).
func (r *run) applyFile(ctx context.Context, t *testing.T, rel string) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(r.dir, rel))
	if err != nil {
		t.Fatal(err)
	}
	docs, err := parseManifest(rel, data, r.c.opts.index)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(r.e.cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range docs {
		kind, _ := o["kind"].(string)
		name, _ := m(o, "metadata")["name"].(string)
		if why, ok := r.c.skipKinds[kind]; ok {
			t.Logf("%s: %s %s not applied: %s", rel, kind, name, why)
			continue
		}
		if err := port(o, r.e.node, r.c.opts); err != nil {
			t.Fatalf("%s: porting %s %s: %v", rel, kind, name, err)
		}
		gvr, ok := resources[kind]
		if !ok {
			t.Fatalf("%s: %s %s: the suite does not know this kind", rel, kind, name)
		}
		meta := m(o, "metadata")
		if !clusterScoped[kind] {
			// The case's own namespace, also for documents the peer put in
			// "default": cases run side by side and clean up by namespace.
			if ns, _ := meta["namespace"].(string); ns == "" || ns == metav1.NamespaceDefault {
				meta["namespace"] = r.ns
			}
			r.namespace(ctx, t, meta["namespace"].(string))
		}
		u := &unstructured.Unstructured{Object: o}
		switch {
		case kind == "Namespace" && r.namespaces[name]:
			continue // made for an earlier document
		case kind == "Namespace":
			_, err = dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				err = nil // left by an earlier case: cases clean namespaces, not delete them
			}
			if err == nil {
				r.namespaces[name] = true
				r.serviceAccount(ctx, t, name)
			}
		case clusterScoped[kind]:
			_, err = dyn.Resource(gvr).Create(ctx, u, metav1.CreateOptions{})
			if err == nil {
				r.clusterObjects = append(r.clusterObjects, clusterObject{gvr, name})
			}
		default:
			_, err = dyn.Resource(gvr).Namespace(meta["namespace"].(string)).Create(ctx, u, metav1.CreateOptions{})
		}
		if err != nil {
			r.refused = append(r.refused, refusal{file: rel, kind: kind, name: name, err: err})
			t.Logf("%s: creating %s %s: %v", rel, kind, name, err)
		}
	}
}

// deletePods deletes the pods of ns and waits until they are gone.
func (r *run) deletePods(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	if err := r.e.client.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Fatalf("%s: deleting the pods of %s: %v", r.c.files[0], ns, err)
	}
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		pods, err := r.e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		return err == nil && len(pods.Items) == 0, err
	})
	if err != nil {
		t.Fatalf("%s: pods of %s not gone: %v", r.c.files[0], ns, err)
	}
}

// waitReleased waits until no claim of ns is reserved for a pod any more
// (the pods completed).
func (r *run) waitReleased(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	err := wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for _, c := range r.claims(ctx, t, ns) {
			if len(c.Status.ReservedFor) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("%s: claims of %s still reserved after the pods completed: %v", r.c.files[0], ns, err)
	}
}

// clusterObject is a cluster-scoped object a case created.
type clusterObject struct {
	gvr  schema.GroupVersionResource
	name string
}

// refusal is an object the API server refused.
type refusal struct {
	file, kind, name string
	err              error
}

// namespace creates ns once, with its default service account.
func (r *run) namespace(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	if r.namespaces[ns] || ns == metav1.NamespaceDefault {
		return
	}
	_, err := r.e.client.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	r.namespaces[ns] = true
	r.serviceAccount(ctx, t, ns)
}

func (r *run) serviceAccount(ctx context.Context, t *testing.T, ns string) {
	t.Helper()
	_, err := r.e.client.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default"}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating the default service account of %s: %v", ns, err)
	}
}

// cleanup deletes what the case made in its namespaces and waits until
// its pods are gone and its claims released, so that the next batch finds
// every GPU free. Namespaces stay: the local cluster's namespace
// controller would take longer than deleting the contents.
func (r *run) cleanup(ctx context.Context, t *testing.T) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(r.e.cluster.RESTConfig())
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range r.clusterObjects {
		if err := dyn.Resource(o.gvr).Delete(ctx, o.name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("%s: deleting %s %s: %v", r.c.files[0], o.gvr.Resource, o.name, err)
		}
	}
	// Workload controllers go first, in the foreground (their pods with
	// them): a ReplicaSet still alive would recreate a pod deleted
	// beside it, after its templates are gone.
	fg := metav1.DeletePropagationForeground
	for ns := range r.namespaces {
		c := r.e.client
		for _, err := range []error{
			c.AppsV1().Deployments(ns).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &fg}, metav1.ListOptions{}),
			c.BatchV1().Jobs(ns).DeleteCollection(ctx, metav1.DeleteOptions{PropagationPolicy: &fg}, metav1.ListOptions{}),
		} {
			if err != nil {
				t.Errorf("cleaning namespace %s: %v", ns, err)
			}
		}
	}
	var left string
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for ns := range r.namespaces {
			rs, err := r.e.client.AppsV1().ReplicaSets(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			jobs, err := r.e.client.BatchV1().Jobs(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			if len(rs.Items)+len(jobs.Items) > 0 {
				left = fmt.Sprintf("namespace %s: %d ReplicaSets, %d Jobs", ns, len(rs.Items), len(jobs.Items))
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("%s: %s left: %v", r.c.files[0], left, err)
	}
	for ns := range r.namespaces {
		c := r.e.client
		for _, err := range []error{
			c.CoreV1().Pods(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}),
			c.ResourceV1().ResourceClaimTemplates(ns).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}),
		} {
			if err != nil {
				t.Errorf("cleaning namespace %s: %v", ns, err)
			}
		}
	}
	err = wait.PollUntilContextTimeout(ctx, 500*time.Millisecond, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
		for ns := range r.namespaces {
			pods, err := r.e.client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			if len(pods.Items) > 0 {
				left = fmt.Sprintf("pod %s/%s (phase %s)", ns, pods.Items[0].Name, pods.Items[0].Status.Phase)
				return false, nil
			}
			// Standalone claims go once no pod reserves them any more.
			claims, err := r.e.client.ResourceV1().ResourceClaims(ns).List(ctx, metav1.ListOptions{})
			if err != nil {
				return false, err
			}
			for _, claim := range claims.Items {
				left = fmt.Sprintf("claim %s/%s (reserved for %d, finalizers %v)", ns, claim.Name, len(claim.Status.ReservedFor), claim.Finalizers)
				if len(claim.Status.ReservedFor) > 0 {
					return false, nil
				}
				if claim.DeletionTimestamp == nil {
					if err := r.e.client.ResourceV1().ResourceClaims(ns).Delete(ctx, claim.Name, metav1.DeleteOptions{}); err != nil && !apierrors.IsNotFound(err) {
						return false, err
					}
				}
			}
			if len(claims.Items) > 0 {
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Errorf("%s: %s left: %v", r.c.files[0], left, err)
	}
}
