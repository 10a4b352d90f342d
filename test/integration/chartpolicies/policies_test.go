//go:build integration

package chartpolicies_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

const (
	// The release as a user installs it: `helm install gpulink` into
	// gpulink-system, which names the service accounts and policies.
	release       = "gpulink"
	chartNS       = "gpulink-system"
	pluginSA      = release + "-kubelet-plugin"
	controllerSA  = release + "-controller"
	podPolicy     = release + "-controller-pods"
	mpsPodPolicy  = release + "-mps-daemon-pods"
	demoNS        = "gpulink-demo" // the kind demo's examples
	gateNS        = "gate-test"
	claimTemplate = "one-gpu"
	pause         = "registry.k8s.io/pause:3.10"
	// excludedNodes is controller.ExcludedNodesAnnotation, written as the
	// controller writes it (controller/exclude.go).
	excludedNodes = "gpu.gpulink.dev/excluded-nodes"
	// otherDriver and otherClass belong to no gpulink component.
	otherDriver = "other.example.com"
	otherClass  = "example.com-fpga"
	otherGate   = "example.com/other"
)

// env holds the clients of the identities the checks act as.
type env struct {
	ctx context.Context
	// admin is system:masters; plugin holds a token of the kubelet
	// plugin's service account bound to a pod on node-a (the API server
	// puts the node into it), unbound one of the same account bound to
	// nothing, controller one of the controller's account.
	admin, plugin, unbound, controller kubernetes.Interface
	dyn                                dynamic.Interface
	mapper                             meta.RESTMapper
}

// TestChartPolicies installs the chart rendered with its default values
// and checks, in order, the renderings' server-side validation, the
// scheduling-gate and claim-finalizer mutations, the kubelet plugin's
// slice rights and the controller's rights. Later steps use the pods of
// the scheduling-gate step.
func TestChartPolicies(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	e := setup(ctx, t)
	t.Run("ServerDryRun", e.testServerDryRun)
	t.Run("SchedulingGate", e.testSchedulingGate)
	t.Run("ClaimFinalizer", e.testClaimFinalizer)
	t.Run("PluginSlices", e.testPluginSlices)
	t.Run("ControllerRBAC", e.testControllerRBAC)
	t.Run("ControllerPodPolicy", e.testControllerPodPolicy)
	t.Run("ControllerNodePolicy", e.testControllerNodePolicy)
	// Last: it installs gate.cpuPods over the defaults (and restores them).
	t.Run("CPUPods", e.testCPUPods)
}

// setup creates the namespaces, installs the rendered chart (no gpulink
// process runs: its Deployment's and DaemonSet's pods stay pending), the
// nodes node-a and node-b and the kubelet plugin's pod on node-a, and mints
// the identities' tokens.
func setup(ctx context.Context, t *testing.T) *env {
	t.Helper()
	e := &env{ctx: ctx, admin: cluster.Client()}
	cfg := cluster.RESTConfig()
	var err error
	if e.dyn, err = dynamic.NewForConfig(cfg); err != nil {
		t.Fatal(err)
	}
	e.mapper = restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(e.admin.Discovery()))

	for _, ns := range []string{chartNS, demoNS, gateNS} {
		if _, err := e.admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating namespace %s: %v", ns, err)
		}
	}
	if err := e.applyChart(ctx); err != nil {
		t.Fatalf("installing the chart: %v", err)
	}
	// No static type check of the policies' CEL here:
	// kube-controller-manager writes it (status.typeChecking) only some
	// time after. Every expression is evaluated below instead, and with
	// failurePolicy Fail a type error at run time turns an expected
	// "allowed" into a failure.

	// Pods need their namespace's default service account, which
	// kube-controller-manager creates.
	for _, ns := range []string{chartNS, demoNS, gateNS} {
		e.poll(t, "the default service account of "+ns, func() bool {
			_, err := e.admin.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil
		})
	}
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := e.admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	pluginPod, err := e.admin.CoreV1().Pods(chartNS).Create(ctx, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "plugin-on-node-a"},
		Spec: corev1.PodSpec{ServiceAccountName: pluginSA, NodeName: "node-a",
			Containers: []corev1.Container{{Name: "c", Image: pause}}},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.plugin = e.tokenClient(t, cfg, pluginSA, pluginPod)
	e.unbound = e.tokenClient(t, cfg, pluginSA, nil)
	e.controller = e.tokenClient(t, cfg, controllerSA, nil)
	return e
}

// tokenClient is a client with a fresh token of the chart's service
// account sa, bound to pod when one is given.
func (e *env) tokenClient(t *testing.T, cfg *rest.Config, sa string, pod *corev1.Pod) kubernetes.Interface {
	t.Helper()
	req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
	if pod != nil {
		req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}
	}
	tr, err := e.admin.CoreV1().ServiceAccounts(chartNS).CreateToken(e.ctx, sa, req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("a token of service account %s/%s: %v", chartNS, sa, err)
	}
	c := rest.AnonymousClientConfig(cfg)
	c.BearerToken = tr.Status.Token
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// resource is the dynamic client of o's kind, in o's namespace for a
// namespaced kind (default when o names none, as kubectl has it).
func (e *env) resource(o *unstructured.Unstructured) (dynamic.ResourceInterface, error) {
	gvk := o.GroupVersionKind()
	m, err := e.mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", gvk, o.GetName(), err)
	}
	if m.Scope.Name() != meta.RESTScopeNameNamespace {
		return e.dyn.Resource(m.Resource), nil
	}
	ns := o.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault
	}
	return e.dyn.Resource(m.Resource).Namespace(ns), nil
}

// fieldManager owns the installed chart's fields, so that a dry run of
// another rendering replaces them as a `helm upgrade` or a `kubectl apply`
// of the new rendering would (its fields, not a merge with the installed
// ones).
const fieldManager = "chartpolicies-test"

// apply applies o (server-side apply, strict field validation), as a dry
// run when dryRun is set.
func (e *env) apply(o *unstructured.Unstructured, dryRun bool) error {
	ri, err := e.resource(o)
	if err != nil {
		return err
	}
	body, err := json.Marshal(o.Object)
	if err != nil {
		return err
	}
	opts := metav1.PatchOptions{FieldManager: fieldManager, Force: ptr.To(true), FieldValidation: metav1.FieldValidationStrict}
	if dryRun {
		opts.DryRun = []string{metav1.DryRunAll}
	}
	if _, err := ri.Patch(e.ctx, o.GetName(), types.ApplyPatchType, body, opts); err != nil {
		return fmt.Errorf("applying %s %s/%s: %w", o.GetKind(), o.GetNamespace(), o.GetName(), err)
	}
	return nil
}

// poll waits up to a minute for cond (a policy takes effect a moment after
// its creation) and fails the test if it never holds.
func (e *env) poll(t *testing.T, what string, cond func() bool) {
	t.Helper()
	if err := wait.PollUntilContextTimeout(e.ctx, 200*time.Millisecond, time.Minute, true, func(context.Context) (bool, error) {
		return cond(), nil
	}); err != nil {
		t.Fatalf("waiting for %s: %v", what, err)
	}
}

// errOf drops a call's result, for checks of its error.
func errOf(_ any, err error) error { return err }

// allow fails the test unless err is nil.
func allow(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Errorf("denied, want allowed: %s: %v", what, err)
		return
	}
	t.Logf("ok: allowed: %s", what)
}

// deny fails the test unless err is the API server's refusal (RBAC and
// the policies answer Forbidden, a policy with reason Invalid Invalid),
// so that another failure (a typo in a name, say) cannot pass for one.
func deny(t *testing.T, what string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("allowed, want denied: %s", what)
	case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
		t.Errorf("failed other than by a refusal, want denied: %s: %v", what, err)
	default:
		t.Logf("ok: denied: %s (%v)", what, err)
	}
}

// denyBy fails the test unless err is the refusal of the
// ValidatingAdmissionPolicy policy, where RBAC would allow the request.
func denyBy(t *testing.T, what, policy string, err error) {
	t.Helper()
	switch {
	case err == nil:
		t.Errorf("allowed, want denied by %s: %s", policy, what)
	case !strings.Contains(err.Error(), fmt.Sprintf("ValidatingAdmissionPolicy '%s'", policy)):
		t.Errorf("denied, but not by %s: %s: %v", policy, what, err)
	default:
		t.Logf("ok: denied: %s (%v)", what, err)
	}
}

// gateNames lists a pod's scheduling gates, in order.
func gateNames(p *corev1.Pod) []string {
	var out []string
	for _, g := range p.Spec.SchedulingGates {
		out = append(out, g.Name)
	}
	return out
}

// renderings are the files the server dry-runs: every rendering of
// hack/helm.sh (its --render mode; the subdirectory crd/ holds objects of
// CRDs this API server lacks and is left out) and the kind demo's
// examples.
func renderings(ctx context.Context, t *testing.T) []string {
	t.Helper()
	root, err := localcluster.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.CommandContext(ctx, "bash", filepath.Join(root, "hack", "helm.sh"), "--render", dir)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("hack/helm.sh --render: %v\n%s", err, out)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("hack/helm.sh --render wrote no renderings to %s (%v)", dir, err)
	}
	examples, err := filepath.Glob(filepath.Join(root, "demo", "kind", "examples", "*.yaml"))
	if err != nil || len(examples) == 0 {
		t.Fatalf("no kind demo examples in %s (%v)", filepath.Join(root, "demo", "kind", "examples"), err)
	}
	return append(files, examples...)
}

// testServerDryRun applies every rendering with a server-side dry run (as
// `kubectl apply --dry-run=server` does, with strict field validation):
// new objects are created, the installed chart's are replaced, and
// nothing is stored.
func (e *env) testServerDryRun(t *testing.T) {
	for _, file := range renderings(e.ctx, t) {
		t.Run(filepath.Base(file), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := localcluster.DecodeObjects(data)
			if err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			if len(objs) == 0 {
				t.Fatalf("%s holds no objects", file)
			}
			for _, o := range objs {
				if err := e.apply(o, true); err != nil {
					t.Errorf("%s: server-side dry run: %v", file, err)
				}
			}
			t.Logf("ok: server-side dry run of %d objects", len(objs))
		})
	}
}

// gatePod is a pod in gate-test; withClaim gives it a claim from the
// template one-gpu (which does not exist: nothing here runs pods).
func gatePod(name string, withClaim bool, gates []string, node string) *corev1.Pod {
	p := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: gateNS},
		Spec:       corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: pause}}},
	}
	for _, g := range gates {
		p.Spec.SchedulingGates = append(p.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: g})
	}
	if withClaim {
		p.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "gpu", ResourceClaimTemplateName: ptr.To(claimTemplate)}}
		p.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "gpu"}}
	}
	return p
}

// testSchedulingGate: the MutatingAdmissionPolicy gives pods with claims
// gpulink's gate, once, after the gates they carry; pods without claims
// and pods bound to a node at creation get none.
func (e *env) testSchedulingGate(t *testing.T) {
	pods := e.admin.CoreV1().Pods(gateNS)
	e.poll(t, "the scheduling-gate policy to take effect", func() bool {
		p, err := pods.Create(e.ctx, gatePod("probe", true, nil, ""), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && slices.Equal(gateNames(p), []string{driver.SchedulingGate})
	})
	for _, c := range []struct {
		pod  *corev1.Pod
		want []string
	}{
		{gatePod("with-claims", true, nil, ""), []string{driver.SchedulingGate}},
		{gatePod("other-gate", true, []string{otherGate}, ""), []string{otherGate, driver.SchedulingGate}},
		{gatePod("already-gated", true, []string{driver.SchedulingGate}, ""), []string{driver.SchedulingGate}},
		{gatePod("no-claims", false, nil, ""), nil},
		// Read from the create's answer: kube-controller-manager's pod
		// GC deletes a pod of a node that does not exist a while later.
		{gatePod("bound", true, nil, "some-node"), nil},
	} {
		got, err := pods.Create(e.ctx, c.pod, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("creating pod %s: %v", c.pod.Name, err)
			continue
		}
		if g := gateNames(got); !slices.Equal(g, c.want) {
			t.Errorf("pod %s: gates %q, want %q", c.pod.Name, g, c.want)
		} else {
			t.Logf("ok: pod %s: gates %q", c.pod.Name, g)
		}
	}
}

// gateClaim is a claim in gate-test with the given requests and
// finalizers.
func gateClaim(name string, finalizers []string, requests ...resourceapi.DeviceRequest) *resourceapi.ResourceClaim {
	return &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: gateNS, Finalizers: finalizers},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: requests}},
	}
}

// exactly is a request of count devices of class.
func exactly(name, class string, count int64) resourceapi.DeviceRequest {
	return resourceapi.DeviceRequest{Name: name, Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: class, Count: count}}
}

// testClaimFinalizer: the MutatingAdmissionPolicy gives claims asking for
// a gpulink class, in any request or alternative, the controller's
// finalizer, once, after those they carry; other claims get none.
func (e *env) testClaimFinalizer(t *testing.T) {
	claims := e.admin.ResourceV1().ResourceClaims(gateNS)
	e.poll(t, "the claim finalizer policy to take effect", func() bool {
		c, err := claims.Create(e.ctx, gateClaim("probe", nil, exactly("g", driver.DeviceClassWhole, 0)), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && slices.Equal(c.Finalizers, []string{driver.ClaimFinalizer})
	})
	fallback := resourceapi.DeviceRequest{Name: "g", FirstAvailable: []resourceapi.DeviceSubRequest{
		{Name: "other", DeviceClassName: otherClass}, {Name: "gl", DeviceClassName: driver.DeviceClassWhole},
	}}
	var created []string
	for _, c := range []struct {
		claim *resourceapi.ResourceClaim
		want  []string
	}{
		{gateClaim("whole", nil, exactly("g", driver.DeviceClassWhole, 2)), []string{driver.ClaimFinalizer}},
		{gateClaim("share", nil, exactly("s", driver.DeviceClassShare, 0)), []string{driver.ClaimFinalizer}},
		{gateClaim("fallback", nil, fallback), []string{driver.ClaimFinalizer}},
		{gateClaim("second-request", nil, exactly("a", otherClass, 0), exactly("b", driver.DeviceClassShare, 0)), []string{driver.ClaimFinalizer}},
		{gateClaim("kept", []string{"example.com/hold"}, exactly("g", driver.DeviceClassWhole, 0)), []string{"example.com/hold", driver.ClaimFinalizer}},
		{gateClaim("once", []string{driver.ClaimFinalizer}, exactly("g", driver.DeviceClassWhole, 0)), []string{driver.ClaimFinalizer}},
		{gateClaim("foreign", nil, exactly("f", otherClass, 0)), nil},
	} {
		got, err := claims.Create(e.ctx, c.claim, metav1.CreateOptions{})
		if err != nil {
			t.Errorf("creating claim %s: %v", c.claim.Name, err)
			continue
		}
		created = append(created, got.Name)
		if !slices.Equal(got.Finalizers, c.want) {
			t.Errorf("claim %s: finalizers %q, want %q", got.Name, got.Finalizers, c.want)
		} else {
			t.Logf("ok: claim %s: finalizers %q", got.Name, got.Finalizers)
		}
	}
	for _, name := range created {
		// Only marked for deletion where a finalizer holds it.
		if err := claims.Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Errorf("deleting claim %s: %v", name, err)
		}
	}
}

// slice is a ResourceSlice of driver with one device on node, in pool
// (the node's name when empty).
func slice(name, node, drv string, generation int64, pool string) *resourceapi.ResourceSlice {
	if pool == "" {
		pool = node
	}
	return &resourceapi.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: name},
		Spec: resourceapi.ResourceSliceSpec{
			Driver: drv, NodeName: ptr.To(node),
			Pool:    resourceapi.ResourcePool{Name: pool, Generation: generation, ResourceSliceCount: 1},
			Devices: []resourceapi.Device{{Name: "gpu-0"}},
		},
	}
}

// testPluginSlices: the kubelet plugin writes and deletes exactly the
// slices of its driver on its own node, in the pool named after that node;
// it updates them (what the plugin's slice controller sends) but does not
// patch them, lists but does not write anything else.
func (e *env) testPluginSlices(t *testing.T) {
	ctx := e.ctx
	create := func(c kubernetes.Interface, s *resourceapi.ResourceSlice) error {
		return errOf(c.ResourceV1().ResourceSlices().Create(ctx, s, metav1.CreateOptions{}))
	}
	// An update without resourceVersion, as `kubectl replace` sends it.
	update := func(c kubernetes.Interface, s *resourceapi.ResourceSlice) error {
		return errOf(c.ResourceV1().ResourceSlices().Update(ctx, s, metav1.UpdateOptions{}))
	}
	del := func(c kubernetes.Interface, name string) error {
		return c.ResourceV1().ResourceSlices().Delete(ctx, name, metav1.DeleteOptions{})
	}
	e.poll(t, "the ResourceSlice policy to take effect", func() bool {
		return errOf(e.plugin.ResourceV1().ResourceSlices().Create(ctx, slice("probe", "node-b", driver.Name, 1, ""),
			metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})) != nil
	})
	allow(t, "plugin creates its node's slice", create(e.plugin, slice("own", "node-a", driver.Name, 1, "")))
	deny(t, "plugin creates a slice for another node", create(e.plugin, slice("foreign", "node-b", driver.Name, 1, "")))
	deny(t, "plugin creates another driver's slice", create(e.plugin, slice("other", "node-a", otherDriver, 1, "")))
	allow(t, "plugin updates its node's slice", update(e.plugin, slice("own", "node-a", driver.Name, 2, "")))
	// Pools are keyed by name and the newest generation wins: a slice of
	// node-a in pool node-b would hide node-b's GPUs.
	deny(t, "plugin creates its node's slice in another node's pool", create(e.plugin, slice("shadow", "node-a", driver.Name, 99, "node-b")))
	deny(t, "plugin creates its node's slice in a pool not named after a node", create(e.plugin, slice("odd-pool", "node-a", driver.Name, 1, "shared")))
	// (spec.pool.name is immutable, so the API server itself refuses
	// moving a slice to another pool.) A slice of node-a in pool node-b
	// that got in some other way, written by an administrator here, stays
	// out of reach too.
	if err := create(e.admin, slice("admin-pool", "node-a", driver.Name, 1, "node-b")); err != nil {
		t.Fatal(err)
	}
	deny(t, "plugin updates a slice of its node that sits in another node's pool", update(e.plugin, slice("admin-pool", "node-a", driver.Name, 99, "node-b")))
	deny(t, "plugin deletes a slice of its node that sits in another node's pool", del(e.plugin, "admin-pool"))
	allow(t, "plugin lists slices", errOf(e.plugin.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})))
	deny(t, "plugin patches a slice (RBAC: the slice controller only updates)",
		errOf(e.plugin.ResourceV1().ResourceSlices().Patch(ctx, "own", types.MergePatchType, []byte(`{"metadata":{"labels":{"patched":"true"}}}`), metav1.PatchOptions{})))
	if err := create(e.admin, slice("theirs", "node-b", driver.Name, 1, "")); err != nil {
		t.Fatal(err)
	}
	deny(t, "plugin updates another node's slice", update(e.plugin, slice("theirs", "node-b", driver.Name, 2, "")))
	deny(t, "plugin deletes another node's slice", del(e.plugin, "theirs"))
	deny(t, "token without a node (not bound to a pod) creates a slice", create(e.unbound, slice("unbound", "node-a", driver.Name, 1, "")))
	allow(t, "plugin deletes its node's slice", del(e.plugin, "own"))
	allow(t, "admin writes slices of any node (the policy binds only the plugin)", update(e.admin, slice("theirs", "node-b", driver.Name, 3, "")))
	// test/integration/kubeletplugin TestMPSDaemonPodPolicy checks every
	// shape of the pods the plugin may create.
	denyBy(t, "plugin may not create pods other than its MPS daemon pods", mpsPodPolicy,
		errOf(e.plugin.CoreV1().Pods(chartNS).Create(ctx, &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: "x", Labels: map[string]string{"run": "x"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "x", Image: pause}}},
		}, metav1.CreateOptions{})))
	deny(t, "plugin may not list claims (RBAC: get only)", errOf(e.plugin.ResourceV1().ResourceClaims(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})))
}

// oneGPUSpec is the claim one-gpu's spec, a whole GPU.
func oneGPUSpec() resourceapi.ResourceClaimSpec {
	return resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{exactly("gpu", driver.DeviceClassWhole, 0)}}}
}

// testControllerRBAC: the controller's role covers what allocating and
// ungating take (claim status and binding, claim finalizers, pod gates,
// reading slices, classes and nodes, events, its Lease, the translated
// claim templates) and not more (other Leases, Leases elsewhere, deleting
// pods); the plugin's role covers none of the controller's writes.
func (e *env) testControllerRBAC(t *testing.T) {
	ctx := e.ctx
	claim, err := e.admin.ResourceV1().ResourceClaims(gateNS).Create(ctx, &resourceapi.ResourceClaim{
		ObjectMeta: metav1.ObjectMeta{Name: "one-gpu", Namespace: gateNS}, Spec: oneGPUSpec(),
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	pod, err := e.admin.CoreV1().Pods(gateNS).Get(ctx, "with-claims", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the scheduling-gate step's pod: %v", err)
	}
	// allocate writes status.allocation and reservedFor the way the
	// controller does, which takes resourceclaims/status and the
	// synthetic resourceclaims/binding; without resourceVersion, as
	// `kubectl replace --subresource=status` sends it.
	allocate := func(c kubernetes.Interface) error {
		a := &resourceapi.ResourceClaim{
			ObjectMeta: metav1.ObjectMeta{Name: claim.Name, Namespace: gateNS},
			Spec:       oneGPUSpec(),
			Status: resourceapi.ResourceClaimStatus{
				Allocation: &resourceapi.AllocationResult{
					Devices: resourceapi.DeviceAllocationResult{Results: []resourceapi.DeviceRequestAllocationResult{
						{Request: "gpu", Driver: driver.Name, Pool: "node-a", Device: "gpu-0"},
					}},
					NodeSelector: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchFields: []corev1.NodeSelectorRequirement{
						{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{"node-a"}},
					}}}},
					AllocationTimestamp: ptr.To(metav1.NewTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))),
				},
				ReservedFor: []resourceapi.ResourceClaimConsumerReference{{Resource: "pods", Name: pod.Name, UID: pod.UID}},
			},
		}
		return errOf(c.ResourceV1().ResourceClaims(gateNS).UpdateStatus(ctx, a, metav1.UpdateOptions{}))
	}
	event := &eventsv1.Event{
		ObjectMeta:          metav1.ObjectMeta{Name: "test.1", Namespace: gateNS},
		EventTime:           metav1.NewMicroTime(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)),
		ReportingController: driver.Name + "/controller", ReportingInstance: "test",
		Action: "Allocate", Reason: "Test", Type: corev1.EventTypeNormal, Note: "test",
		Regarding: corev1.ObjectReference{Kind: "Pod", Namespace: gateNS, Name: pod.Name},
	}
	lease := func(name, ns string) *coordinationv1.Lease {
		return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}}
	}
	// The translation webhook's templates: created in the pod's namespace,
	// refreshed, listed and deleted by the collector.
	compatTemplate := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "gpulink-compat-test", Namespace: gateNS, Labels: map[string]string{compat.LabelManaged: "true"}},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: oneGPUSpec()},
	}

	deny(t, "plugin allocates a claim (RBAC)", allocate(e.plugin))
	allow(t, "controller allocates a claim (status + binding)", allocate(e.controller))
	allow(t, "controller adds its finalizer to a claim",
		errOf(e.controller.ResourceV1().ResourceClaims(gateNS).Patch(ctx, claim.Name, types.MergePatchType,
			[]byte(fmt.Sprintf(`{"metadata":{"finalizers":[%q]}}`, driver.ClaimFinalizer)), metav1.PatchOptions{})))
	allow(t, "controller lifts a pod's scheduling gate",
		errOf(e.controller.CoreV1().Pods(gateNS).Patch(ctx, pod.Name, types.JSONPatchType,
			[]byte(`[{"op":"remove","path":"/spec/schedulingGates/0"}]`), metav1.PatchOptions{})))
	allow(t, "controller reads slices, classes and nodes", func() error {
		if _, err := e.controller.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		if _, err := e.controller.ResourceV1().DeviceClasses().List(ctx, metav1.ListOptions{}); err != nil {
			return err
		}
		return errOf(e.controller.CoreV1().Nodes().List(ctx, metav1.ListOptions{}))
	}())
	allow(t, "controller records an event", errOf(e.controller.EventsV1().Events(gateNS).Create(ctx, event, metav1.CreateOptions{})))
	allow(t, "controller creates its Lease", errOf(e.controller.CoordinationV1().Leases(chartNS).Create(ctx, lease(controllerSA, chartNS), metav1.CreateOptions{})))
	allow(t, "controller reads its Lease", errOf(e.controller.CoordinationV1().Leases(chartNS).Get(ctx, controllerSA, metav1.GetOptions{})))
	if _, err := e.admin.CoordinationV1().Leases(chartNS).Create(ctx, lease("other", chartNS), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	deny(t, "controller reads another Lease", errOf(e.controller.CoordinationV1().Leases(chartNS).Get(ctx, "other", metav1.GetOptions{})))
	deny(t, "controller creates a Lease in another namespace", errOf(e.controller.CoordinationV1().Leases(gateNS).Create(ctx, lease(controllerSA, gateNS), metav1.CreateOptions{})))
	deny(t, "controller may not delete pods", e.controller.CoreV1().Pods(gateNS).Delete(ctx, "no-claims", metav1.DeleteOptions{}))
	allow(t, "controller creates a translated ResourceClaimTemplate", errOf(e.controller.ResourceV1().ResourceClaimTemplates(gateNS).Create(ctx, compatTemplate, metav1.CreateOptions{})))
	review, err := e.controller.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: gateNS, Verb: "update", Group: resourceapi.GroupName, Resource: "resourceclaimtemplates", Name: compatTemplate.Name,
		}},
	}, metav1.CreateOptions{})
	switch {
	case err != nil:
		t.Errorf("asking whether the controller may update a translated template: %v", err)
	case !review.Status.Allowed:
		t.Errorf("denied, want allowed: controller refreshes a translated template (update): %s", review.Status.Reason)
	default:
		t.Log("ok: allowed: controller refreshes a translated template (update)")
	}
	allow(t, "controller lists translated templates everywhere",
		errOf(e.controller.ResourceV1().ResourceClaimTemplates(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: compat.LabelManaged + "=true"})))
	allow(t, "controller deletes an unused translated template", e.controller.ResourceV1().ResourceClaimTemplates(gateNS).Delete(ctx, compatTemplate.Name, metav1.DeleteOptions{}))
	deny(t, "plugin creates a ResourceClaimTemplate", errOf(e.plugin.ResourceV1().ResourceClaimTemplates(gateNS).Create(ctx, compatTemplate, metav1.CreateOptions{})))
}

// testControllerPodPolicy: the ValidatingAdmissionPolicy on the
// controller's pod updates lets through lifting gpulink's gate (the patch
// controller/gate.go sends), annotations under gpu.gpulink.dev/ (the
// excluded nodes of controller/exclude.go) and patches that change
// nothing; it refuses every other change, which RBAC alone would allow,
// and leaves other identities alone.
func (e *env) testControllerPodPolicy(t *testing.T) {
	ctx := e.ctx
	e.poll(t, "the ValidatingAdmissionPolicy "+podPolicy+" to take effect", func() bool {
		return errOf(e.controller.CoreV1().Pods(gateNS).Patch(ctx, "no-claims", types.MergePatchType, []byte(`{"metadata":{"labels":{"probe":"1"}}}`),
			metav1.PatchOptions{DryRun: []string{metav1.DryRunAll}})) != nil
	})
	// other-gate carries [example.com/other, gpu.gpulink.dev/allocation].
	target, err := e.admin.CoreV1().Pods(gateNS).Get(ctx, "other-gate", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the scheduling-gate step's pod: %v", err)
	}
	patch := func(c kubernetes.Interface, pt types.PatchType, body string) error {
		return errOf(c.CoreV1().Pods(gateNS).Patch(ctx, target.Name, pt, []byte(body), metav1.PatchOptions{}))
	}
	for _, c := range []struct {
		what string
		pt   types.PatchType
		body string
	}{
		{"controller adds a label to a pod", types.MergePatchType, `{"metadata":{"labels":{"evil":"true"}}}`},
		{"controller changes a pod's container image", types.JSONPatchType, `[{"op":"replace","path":"/spec/containers/0/image","value":"registry.example.com/evil:1"}]`},
		{"controller adds a toleration to a pod", types.JSONPatchType, `[{"op":"add","path":"/spec/tolerations/-","value":{"key":"dedicated","operator":"Exists"}}]`},
		{"controller adds a node selector to a gated pod", types.JSONPatchType, `[{"op":"add","path":"/spec/nodeSelector","value":{"kubernetes.io/hostname":"node-a"}}]`},
		{"controller removes another component's scheduling gate", types.JSONPatchType, `[{"op":"remove","path":"/spec/schedulingGates/0"}]`},
		{"controller sets an annotation outside gpu.gpulink.dev/", types.MergePatchType, `{"metadata":{"annotations":{"example.com/note":"x"}}}`},
		{"controller adds a finalizer to a pod", types.JSONPatchType, `[{"op":"add","path":"/metadata/finalizers","value":["example.com/hold"]}]`},
		{"controller lifts its gate and adds a label in one patch", types.JSONPatchType, `[{"op":"remove","path":"/spec/schedulingGates/1"},{"op":"add","path":"/metadata/labels","value":{"evil":"true"}}]`},
	} {
		denyBy(t, c.what, podPolicy, patch(e.controller, c.pt, c.body))
	}
	allow(t, "controller sets an annotation under gpu.gpulink.dev/ (the policy's allow-list)",
		patch(e.controller, types.MergePatchType, `{"metadata":{"annotations":{"gpu.gpulink.dev/note":"x"}}}`))
	allow(t, "controller removes its annotation again",
		patch(e.controller, types.MergePatchType, `{"metadata":{"annotations":{"gpu.gpulink.dev/note":null}}}`))
	// The patch that records the nodes a pod was unschedulable on
	// (controller/exclude.go): a merge patch of that annotation, the UID
	// as precondition.
	allow(t, "controller records excluded nodes on a pod", patch(e.controller, types.MergePatchType,
		fmt.Sprintf(`{"metadata":{"uid":%q,"annotations":{%q:"node-a,node-b"}}}`, target.UID, excludedNodes)))
	allow(t, "controller clears excluded nodes", patch(e.controller, types.MergePatchType,
		fmt.Sprintf(`{"metadata":{"uid":%q,"annotations":{%q:null}}}`, target.UID, excludedNodes)))
	// The patch the controller sends (controller/gate.go): test the UID
	// and the gate's name at its index, then remove it.
	allow(t, "controller lifts its gate and leaves the other gate", patch(e.controller, types.JSONPatchType,
		fmt.Sprintf(`[{"op":"test","path":"/metadata/uid","value":%q},{"op":"test","path":"/spec/schedulingGates/1/name","value":%q},{"op":"remove","path":"/spec/schedulingGates/1"}]`,
			target.UID, driver.SchedulingGate)))
	if got, err := e.admin.CoreV1().Pods(gateNS).Get(ctx, target.Name, metav1.GetOptions{}); err != nil {
		t.Error(err)
	} else if g := gateNames(got); !slices.Equal(g, []string{otherGate}) {
		t.Errorf("pod %s: gates %q after the controller lifted its gate, want %q", target.Name, g, []string{otherGate})
	}
	allow(t, "controller sends a patch that changes nothing",
		patch(e.controller, types.JSONPatchType, fmt.Sprintf(`[{"op":"test","path":"/metadata/name","value":%q}]`, target.Name)))
	allow(t, "another identity (admin) still changes labels, images and gates", patch(e.admin, types.JSONPatchType,
		`[{"op":"add","path":"/metadata/labels","value":{"app":"x"}},{"op":"replace","path":"/spec/containers/0/image","value":"registry.k8s.io/pause:3.9"},{"op":"remove","path":"/spec/schedulingGates/0"}]`))
}
