//go:build integration

package kubeletplugin_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/kubeletplugin/mps"
	"github.com/gpulink/gpulink/test/localcluster"
)

const (
	policyNS         = "gpulink-system"
	pluginSA         = "gpulink-kubelet-plugin"
	policyDriverRoot = "/run/nvidia/driver"
	policyImage      = "gpulink.local/gpulink:policy-test"
)

// renderPluginPolicies renders the kubelet plugin's RBAC and pod admission
// policy with the project's helm, as `helm template` would for a user.
func renderPluginPolicies(t *testing.T, mpsRoot string) []*unstructured.Unstructured {
	t.Helper()
	out, err := localcluster.HelmTemplate(context.Background(), "gpulink", policyNS,
		"--set", "image.repository=gpulink.local/gpulink", "--set", "image.tag=policy-test",
		"--set", "kubeletPlugin.driverRoot="+policyDriverRoot, "--set", "kubeletPlugin.mpsRoot="+mpsRoot,
		"--show-only", "templates/kubeletplugin-rbac.yaml", "--show-only", "templates/kubeletplugin-pod-admission.yaml")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := localcluster.DecodeObjects(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

// applyObjects creates rendered objects with the admin's rights.
func applyObjects(ctx context.Context, t *testing.T, cfg *rest.Config, objs []*unstructured.Unstructured) {
	t.Helper()
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	resources := map[string]string{
		"ServiceAccount": "serviceaccounts", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
		"Role": "roles", "RoleBinding": "rolebindings",
		"ValidatingAdmissionPolicy": "validatingadmissionpolicies", "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
	}
	for _, o := range objs {
		gv, err := schema.ParseGroupVersion(o.GetAPIVersion())
		if err != nil {
			t.Fatal(err)
		}
		res, ok := resources[o.GetKind()]
		if !ok {
			t.Fatalf("unexpected kind %s in the rendered plugin policies", o.GetKind())
		}
		var ri dynamic.ResourceInterface = dyn.Resource(gv.WithResource(res))
		if o.GetNamespace() != "" {
			ri = dyn.Resource(gv.WithResource(res)).Namespace(o.GetNamespace())
		}
		if _, err := ri.Create(ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatalf("creating %s %s: %v", o.GetKind(), o.GetName(), err)
		}
	}
}

// tokenClient is a client authenticating with token.
func tokenClient(t *testing.T, cfg *rest.Config, token string) kubernetes.Interface {
	t.Helper()
	c := rest.AnonymousClientConfig(cfg)
	c.BearerToken = token
	// The daemon's start polls its pod; the default client rate limit
	// would fail those polls near the test's short start timeout.
	c.QPS, c.Burst = 100, 200
	cs, err := kubernetes.NewForConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestMPSDaemonPodPolicy checks the kubelet plugin's pod rights on a live
// API server with real tokens of its service account, one bound to a
// plugin pod on node-a (the API server puts the node into the token) and
// one bound to nothing: the plugin creates and deletes exactly the MPS
// daemon pods it builds (the real mps.PodDaemon code) on its own node, and
// nothing else; it reads no pod outside its namespace.
func TestMPSDaemonPodPolicy(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir := t.TempDir()
	cluster := localcluster.StartForTest(ctx, t, dir, localcluster.Options{})
	admin := cluster.Client()
	cfg := cluster.RESTConfig()
	mpsRoot := filepath.Join(dir, "mps")

	for _, ns := range []string{policyNS, "tenant"} {
		if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	applyObjects(ctx, t, cfg, renderPluginPolicies(t, mpsRoot))
	for _, n := range []string{"node-a", "node-b"} {
		if _, err := admin.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// The service accounts' token controller is kube-controller-manager's:
	// wait for the namespaces' default service accounts, which pods need.
	for _, ns := range []string{policyNS, "tenant"} {
		if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
			_, err := admin.CoreV1().ServiceAccounts(ns).Get(ctx, "default", metav1.GetOptions{})
			return err == nil, nil
		}); err != nil {
			t.Fatalf("default service account of %s: %v", ns, err)
		}
	}
	pause := func(name, ns, node string) *corev1.Pod {
		return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}}}}
	}
	pluginPod := pause("plugin-on-node-a", policyNS, "node-a")
	pluginPod.Spec.ServiceAccountName = pluginSA
	pluginPod, err := admin.CoreV1().Pods(policyNS).Create(ctx, pluginPod, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mint := func(bound *corev1.Pod) string {
		req := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)}}
		if bound != nil {
			req.Spec.BoundObjectRef = &authenticationv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: bound.Name, UID: bound.UID}
		}
		tr, err := admin.CoreV1().ServiceAccounts(policyNS).CreateToken(ctx, pluginSA, req, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return tr.Status.Token
	}
	plugin := tokenClient(t, cfg, mint(pluginPod))
	unbound := tokenClient(t, cfg, mint(nil))

	// The real daemon code, talking to the API server with the plugin's
	// token. Its driver root mount holds the files it looks for.
	mount := filepath.Join(dir, "driver-root")
	for _, f := range []string{"usr/bin/nvidia-cuda-mps-control", "usr/lib/x86_64-linux-gnu/libcuda.so.1"} {
		p := filepath.Join(mount, f)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	daemon, err := mps.NewPodDaemon(mps.PodDaemonConfig{
		Pods: plugin.CoreV1(), Nodes: plugin.CoreV1(), Namespace: policyNS, Image: policyImage, NodeName: "node-a",
		DriverRoot: policyDriverRoot, DriverRootMount: mount,
		Run: func(context.Context, string, []string, []string, string) ([]byte, error) {
			return nil, errors.New("no daemon on an API-only node")
		},
		PollInterval: 100 * time.Millisecond, StartTimeout: 2 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	manager := mps.NewManager(mpsRoot, daemon)
	share := mps.Share{Claim: types.UID("0b4c2a38-5a7e-4b0e-9d0a-6f1c2d3e4f50"),
		GPUs: []mps.Device{{GPU: mps.GPU{Index: 0, UUID: "GPU-0"}, MemoryBytes: 1 << 30}}, Cores: 30}
	dirs := manager.Dirs(share)
	// The shape checks below use another claim: dry runs of share's own
	// pod would meet it, still terminating after EnsureDaemon.
	checked := share
	checked.Claim = "0b4c2a38-5a7e-4b0e-9d0a-6f1c2d3e4f52"
	good := func() *corev1.Pod { return daemon.DaemonPod(checked, manager.Dirs(checked)) }

	// The policy takes effect shortly after it is created.
	if err := wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p := good()
		p.Spec.NodeName = "node-b"
		_, err := plugin.CoreV1().Pods(policyNS).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), nil
	}); err != nil {
		t.Fatalf("the pod admission policy never took effect: %v", err)
	}

	// Start, through the plugin's token, creates the daemon pod (allowed),
	// waits for a daemon that never answers on an API-only node and
	// deletes the pod again (allowed): both writes went through.
	err = manager.EnsureDaemon(ctx, share)
	if err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("EnsureDaemon: %v; want the daemon's start timeout after a successful create", err)
	}
	if err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
		// No kubelet confirms the deletion on an API-only node: the pod
		// stays terminating, which is what the delete can do here.
		p, err := admin.CoreV1().Pods(policyNS).Get(ctx, "gpulink-mps-"+string(share.Claim), metav1.GetOptions{})
		return apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil), nil
	}); err != nil {
		t.Fatal("the plugin's failed start left its daemon pod behind")
	}

	create := func(c kubernetes.Interface, p *corev1.Pod) error {
		_, err := c.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err
	}
	expectDenied := func(what string, err error, wantIn string) {
		t.Helper()
		switch {
		case err == nil:
			t.Errorf("%s: allowed, want denied", what)
		case !apierrors.IsForbidden(err) && !apierrors.IsInvalid(err):
			t.Errorf("%s: %v, want Forbidden", what, err)
		case wantIn != "" && !strings.Contains(err.Error(), wantIn):
			t.Errorf("%s: denied with %q, want it to mention %q", what, err, wantIn)
		default:
			t.Logf("ok: denied: %s (%s)", what, err)
		}
	}
	if err := create(plugin, good()); err != nil {
		t.Fatalf("the daemon pod the plugin builds is denied: %v", err)
	}

	// The controller's service account exists, as in a real release, so
	// that the policy and not the ServiceAccount admission refuses it.
	if _, err := admin.CoreV1().ServiceAccounts(policyNS).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "gpulink-controller"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	privilegedRoot := corev1.Volume{Name: "host", VolumeSource: corev1.VolumeSource{HostPath: &corev1.HostPathVolumeSource{Path: "/"}}}
	variants := []struct {
		what, wantIn string
		change       func(p *corev1.Pod)
	}{
		{"daemon pod for another node", "bound to that node", func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }},
		{"daemon pod labelled for another node", "labels", func(p *corev1.Pod) { p.Labels["gpu.gpulink.dev/node"] = "node-b" }},
		{"pod not named gpulink-mps-<claim>", "gpulink-mps-", func(p *corev1.Pod) { p.Name = "evil" }},
		{"another image", "image", func(p *corev1.Pod) { p.Spec.Containers[0].Image = "registry.k8s.io/pause:3.10" }},
		{"another command", "nvidia-cuda-mps-control -f", func(p *corev1.Pod) { p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "cat /host/etc/shadow"} }},
		{"extra args", "nvidia-cuda-mps-control -f", func(p *corev1.Pod) { p.Spec.Containers[0].Args = []string{"x"} }},
		{"the host's / mounted", "hostPath", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, privilegedRoot)
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/host"})
		}},
		{"another claim's MPS directory", "hostPath", func(p *corev1.Pod) {
			for i := range p.Spec.Volumes {
				if p.Spec.Volumes[i].Name == "mps" {
					p.Spec.Volumes[i].HostPath.Path = filepath.Join(mpsRoot, "11111111-2222-3333-4444-555555555555")
				}
			}
		}},
		{"driver root mounted writable", "read-only", func(p *corev1.Pod) {
			for i := range p.Spec.Containers[0].VolumeMounts {
				p.Spec.Containers[0].VolumeMounts[i].ReadOnly = false
			}
		}},
		// Bidirectional propagation the API server itself refuses to an
		// unprivileged container; HostToContainer is the policy's to refuse.
		{"mount propagation", "read-only", func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts[1].MountPropagation = ptr.To(corev1.MountPropagationHostToContainer)
		}},
		// Each volume only where the plugin mounts it: the MPS directory,
		// writable by the token's holder, over the driver's binaries
		// would make the daemon run what they wrote there.
		{"the MPS directory over the driver's binaries", "may only mount driver-root at", func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts[1].MountPath = "/driver-root/usr/bin"
		}},
		{"shm over the driver's libraries", "may only mount driver-root at", func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts[2].MountPath = "/driver-root/usr/lib/x86_64-linux-gnu"
		}},
		{"the driver root elsewhere", "may only mount driver-root at", func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts[0].MountPath = "/usr"
		}},
		{"the MPS directory mounted twice", "may only mount driver-root at", func(p *corev1.Pod) {
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "mps", MountPath: "/driver-root/bin"})
		}},
		{"an emptyDir", "hostPath", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "scratch", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
		}},
		{"the controller's service account", "default service account", func(p *corev1.Pod) { p.Spec.ServiceAccountName = "gpulink-controller" }},
		{"a service account token", "service account", func(p *corev1.Pod) { p.Spec.AutomountServiceAccountToken = ptr.To(true) }},
		{"host network", "host", func(p *corev1.Pod) { p.Spec.HostNetwork = true }},
		{"host PID", "host", func(p *corev1.Pod) { p.Spec.HostPID = true }},
		{"host IPC", "host", func(p *corev1.Pod) { p.Spec.HostIPC = true }},
		{"a Secret through env", "by value", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "CUDA_VISIBLE_DEVICES", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "gpulink-webhook-tls"}, Key: "tls.key"}}})
		}},
		{"LD_PRELOAD", "by value", func(p *corev1.Pod) {
			p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, corev1.EnvVar{Name: "LD_PRELOAD", Value: "/x.so"})
		}},
		{"LD_LIBRARY_PATH outside the driver root", "by value", func(p *corev1.Pod) {
			for i := range p.Spec.Containers[0].Env {
				if p.Spec.Containers[0].Env[i].Name == "LD_LIBRARY_PATH" {
					p.Spec.Containers[0].Env[i].Value = dirs.Pipe
				}
			}
		}},
		{"a second container", "exactly one", func(p *corev1.Pod) {
			p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "x", Image: policyImage})
		}},
		{"an init container", "spec.initContainers", func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "x", Image: policyImage}}
		}},
		{"a node selector", "spec.nodeSelector", func(p *corev1.Pod) { p.Spec.NodeSelector = map[string]string{"a": "b"} }},
		{"a pod security context", "securityContext", func(p *corev1.Pod) {
			p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: ptr.To[int64](0)}
		}},
		{"added capabilities", "must not be privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities = &corev1.Capabilities{Add: []corev1.Capability{"SYS_ADMIN"}}
		}},
		// The daemon gets its device nodes from the device plugin: the
		// container may no longer be privileged (it was before).
		{"a privileged container", "must not be privileged", func(p *corev1.Pod) {
			// (privileged with allowPrivilegeEscalation false is invalid)
			p.Spec.Containers[0].SecurityContext.Privileged = ptr.To(true)
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		}},
		{"privileged instead of the plugin's security context", "must not be privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}},
		{"no security context", "must not be privileged", func(p *corev1.Pod) { p.Spec.Containers[0].SecurityContext = nil }},
		{"privilege escalation", "must not be privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.AllowPrivilegeEscalation = ptr.To(true)
		}},
		// Root with CAP_SETUID and CAP_SETGID, nothing else (the daemon
		// starts each client's server as the client's user).
		{"running as another user", "must not be privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.RunAsUser = ptr.To[int64](1000)
		}},
		{"no runAsUser", "must not be privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.RunAsUser = nil
		}},
		{"another capability beside SETUID and SETGID", "must not be privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Add = append(p.Spec.Containers[0].SecurityContext.Capabilities.Add, "DAC_OVERRIDE")
		}},
		{"capabilities not dropped", "must not be privileged", func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext.Capabilities.Drop = nil
		}},
		{"another resource name", "may only ask for limits of 1", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits["nvidia.com/gpu"] = resource.MustParse("1")
		}},
		{"another resource of the device plugin's domain", "may only ask for limits of 1", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits["mps-daemon.gpu.gpulink.dev/all"] = resource.MustParse("1")
		}},
		{"two slots of a GPU", "may only ask for limits of 1", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits["mps-daemon.gpu.gpulink.dev/gpu-0"] = resource.MustParse("2")
		}},
		{"a memory request", "may only ask for limits of 1", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Requests = corev1.ResourceList{"memory": resource.MustParse("1Gi")}
		}},
		{"no resources", "may only ask for limits of 1", func(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} }},
	}
	for _, v := range variants {
		p := good()
		v.change(p)
		expectDenied(v.what, create(plugin, p), v.wantIn)
	}
	expectDenied("token bound to no pod (no node) creates the daemon pod", create(unbound, good()), "names its node")
	expectDenied("daemon pod named after no claim UID, labelled so", create(plugin, func() *corev1.Pod {
		p := good()
		p.Name, p.Labels["gpu.gpulink.dev/claim-uid"] = "gpulink-mps-evil", "evil"
		return p
	}()), "gpulink-mps-<claim UID> or gpulink-mps-<namespace>-gpu-<GPU UUID>")

	// The daemon of a namespace's Concurrent MPS shares on one GPU
	// (sharing.mpsMode Concurrent): named after the namespace and the
	// GPU's UUID, serving that GPU only, on the plugin's own node.
	const gpuA, gpuB = "GPU-8f6e1a2b-0c3d-4e5f-8a9b-0c1d2e3f4a5b", "GPU-11111111-0c3d-4e5f-8a9b-0c1d2e3f4a5b"
	groupShare := mps.Share{Claim: "0b4c2a38-5a7e-4b0e-9d0a-6f1c2d3e4f53", Group: "tenant",
		GPUs: []mps.Device{{GPU: mps.GPU{Index: 0, UUID: gpuA}, MemoryBytes: 1 << 30}}, Cores: 30}
	goodGroup := func() *corev1.Pod { return daemon.DaemonPod(groupShare, manager.Dirs(groupShare)) }
	if name := goodGroup().Name; name != "gpulink-mps-tenant-gpu-8f6e1a2b-0c3d-4e5f-8a9b-0c1d2e3f4a5b" {
		t.Fatalf("group daemon pod name %s", name)
	}
	if err := create(plugin, goodGroup()); err != nil {
		t.Fatalf("the group daemon pod the plugin builds is denied: %v", err)
	}
	setEnv := func(p *corev1.Pod, name, value string) {
		for i := range p.Spec.Containers[0].Env {
			if p.Spec.Containers[0].Env[i].Name == name {
				p.Spec.Containers[0].Env[i].Value = value
			}
		}
	}
	for _, v := range []struct {
		what, wantIn string
		change       func(p *corev1.Pod)
	}{
		{"group daemon pod for another node", "bound to that node", func(p *corev1.Pod) { p.Spec.NodeName = "node-b" }},
		{"group daemon pod labelled for another node", "labels", func(p *corev1.Pod) { p.Labels["gpu.gpulink.dev/node"] = "node-b" }},
		{"group daemon pod labelled with another namespace", "labels", func(p *corev1.Pod) { p.Labels["gpu.gpulink.dev/mps-group"] = "other" }},
		{"group daemon pod labelled with a claim as well", "labels", func(p *corev1.Pod) { p.Labels["gpu.gpulink.dev/claim-uid"] = string(groupShare.Claim) }},
		{"group daemon pod with a made-up GPU in its name (no UUID)", "gpulink-mps-<namespace>-gpu-<GPU UUID>", func(p *corev1.Pod) {
			p.Name = "gpulink-mps-tenant-gpu-0"
		}},
		{"group daemon pod serving a GPU other than its name's", "serves the one GPU its name ends with", func(p *corev1.Pod) {
			setEnv(p, "CUDA_VISIBLE_DEVICES", gpuB)
		}},
		{"group daemon pod serving two GPUs", "serves the one GPU its name ends with", func(p *corev1.Pod) {
			setEnv(p, "CUDA_VISIBLE_DEVICES", gpuA+","+gpuB)
		}},
		{"group daemon pod serving every GPU", "serves the one GPU its name ends with", func(p *corev1.Pod) {
			var env []corev1.EnvVar
			for _, e := range p.Spec.Containers[0].Env {
				if e.Name != "CUDA_VISIBLE_DEVICES" {
					env = append(env, e)
				}
			}
			p.Spec.Containers[0].Env = env
		}},
		{"group daemon pod asking for two GPUs' resources", "one GPU's resource", func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources.Limits["mps-daemon.gpu.gpulink.dev/gpu-1"] = resource.MustParse("1")
		}},
		{"group daemon pod mounting another group's MPS directory", "hostPath", func(p *corev1.Pod) {
			for i := range p.Spec.Volumes {
				if p.Spec.Volumes[i].Name == "mps" {
					p.Spec.Volumes[i].HostPath.Path = filepath.Join(mpsRoot, "other-gpu-8f6e1a2b-0c3d-4e5f-8a9b-0c1d2e3f4a5b")
				}
			}
		}},
		{"group daemon pod with the host's / mounted", "hostPath", func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, privilegedRoot)
			p.Spec.Containers[0].VolumeMounts = append(p.Spec.Containers[0].VolumeMounts, corev1.VolumeMount{Name: "host", MountPath: "/host"})
		}},
		{"group daemon pod running another command", "nvidia-cuda-mps-control -f", func(p *corev1.Pod) {
			p.Spec.Containers[0].Command = []string{"/bin/sh", "-c", "cat /host/etc/shadow"}
		}},
	} {
		p := goodGroup()
		v.change(p)
		expectDenied(v.what, create(plugin, p), v.wantIn)
	}
	// The real code creates and deletes a group's daemon pod with the
	// plugin's token (it never answers on an API-only node).
	if err := manager.EnsureDaemon(ctx, groupShare); err == nil || !strings.Contains(err.Error(), "did not answer") {
		t.Fatalf("EnsureDaemon of a group: %v; want the daemon's start timeout after a successful create", err)
	}
	// The good pod asked for the GPU's MPS daemon resource, and the
	// shape the plugin builds carries nothing else.
	if c := good().Spec.Containers[0]; c.Resources.Limits.Name("mps-daemon.gpu.gpulink.dev/gpu-0", resource.DecimalSI).Value() != 1 || c.SecurityContext.Privileged != nil {
		t.Errorf("the plugin's daemon container: resources %v, security context %+v", c.Resources, c.SecurityContext)
	}
	// Only the plugin's daemon pods may ask for the device plugin's
	// resources: a tenant's pod (here even the admin's) may not, in any
	// namespace, nor through an init container.
	greedy := pause("greedy", "tenant", "node-a")
	greedy.Spec.Containers[0].Resources.Limits = corev1.ResourceList{"mps-daemon.gpu.gpulink.dev/gpu-0": resource.MustParse("1")}
	// Created with the other policy, it may take effect a little later.
	_ = wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		err := create(admin, greedy)
		return err != nil && strings.Contains(err.Error(), "ValidatingAdmissionPolicy"), nil
	})
	expectDenied("a tenant's pod asking for an MPS daemon resource", create(admin, greedy), "reserved for the MPS control daemon pods")
	greedyInit := pause("greedy-init", policyNS, "node-a")
	greedyInit.Spec.InitContainers = []corev1.Container{{Name: "i", Image: "registry.k8s.io/pause:3.10", Resources: corev1.ResourceRequirements{
		Requests: corev1.ResourceList{"mps-daemon.gpu.gpulink.dev/gpu-1": resource.MustParse("1")},
		Limits:   corev1.ResourceList{"mps-daemon.gpu.gpulink.dev/gpu-1": resource.MustParse("1")}}}}
	expectDenied("an init container asking for an MPS daemon resource", create(admin, greedyInit), "reserved for the MPS control daemon pods")
	if err := create(admin, pause("modest", "tenant", "node-a")); err != nil {
		t.Errorf("a tenant's pod without MPS daemon resources: %v", err)
	}
	other := good()
	other.Namespace = "tenant"
	expectDenied("daemon pod in a tenant namespace (RBAC)", create(plugin, other), "")

	// Deletes: its own node's daemon pods only.
	mustCreate := func(p *corev1.Pod) {
		t.Helper()
		if _, err := admin.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	share2 := share
	share2.Claim = "0b4c2a38-5a7e-4b0e-9d0a-6f1c2d3e4f51"
	own := daemon.DaemonPod(share2, manager.Dirs(share2))
	// Created with the plugin's token: only the plugin may ask for the
	// MPS daemon resources.
	if _, err := plugin.CoreV1().Pods(policyNS).Create(ctx, own, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	theirs := good()
	// node-b's plugin would create this one; the admin stands in for it,
	// and may not ask for the MPS daemon resources.
	theirs.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	theirs.Name = "gpulink-mps-22222222-2222-3333-4444-555555555555"
	theirs.Labels["gpu.gpulink.dev/claim-uid"] = "22222222-2222-3333-4444-555555555555"
	theirs.Labels["gpu.gpulink.dev/node"] = "node-b"
	theirs.Spec.NodeName = "node-b"
	mustCreate(theirs)
	mustCreate(pause("gpulink-controller-0", policyNS, "node-a"))
	// The same group's daemon on a GPU of node-b, and one on node-a whose
	// plugin may create it.
	theirsGroup := goodGroup()
	theirsGroup.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
	theirsGroup.Name = "gpulink-mps-tenant-gpu-22222222-0c3d-4e5f-8a9b-0c1d2e3f4a5b"
	theirsGroup.Labels["gpu.gpulink.dev/node"] = "node-b"
	theirsGroup.Spec.NodeName = "node-b"
	mustCreate(theirsGroup)
	ownGroupShare := groupShare
	ownGroupShare.GPUs = []mps.Device{{GPU: mps.GPU{Index: 1, UUID: gpuB}, MemoryBytes: 1 << 30}}
	ownGroup := daemon.DaemonPod(ownGroupShare, manager.Dirs(ownGroupShare))
	if _, err := plugin.CoreV1().Pods(policyNS).Create(ctx, ownGroup, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	del := func(name string) error {
		return plugin.CoreV1().Pods(policyNS).Delete(ctx, name, metav1.DeleteOptions{DryRun: []string{metav1.DryRunAll}})
	}
	expectDenied("plugin deletes another node's daemon pod", del(theirs.Name), "bound to that node")
	expectDenied("plugin deletes another node's group daemon pod", del(theirsGroup.Name), "bound to that node")
	expectDenied("plugin deletes the controller's pod", del("gpulink-controller-0"), "gpulink-mps-")
	if err := del(own.Name); err != nil {
		t.Errorf("plugin deleting its own node's daemon pod: %v", err)
	}
	if err := del(ownGroup.Name); err != nil {
		t.Errorf("plugin deleting its own node's group daemon pod: %v", err)
	}

	// Reads: its own namespace only (hole: a node read every tenant's pods).
	mustCreate(pause("tenant-pod", "tenant", "node-b"))
	if _, err := plugin.CoreV1().Pods("tenant").Get(ctx, "tenant-pod", metav1.GetOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("plugin reads a tenant's pod: %v, want Forbidden", err)
	}
	if _, err := plugin.CoreV1().Pods("").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("plugin lists every pod: %v, want Forbidden", err)
	}
	// Orphan cleanup lists this node's daemon pods in its namespace and
	// deletes the ones whose claim is not prepared: with the real code.
	removed, err := manager.RemoveOrphans(ctx, map[string]bool{})
	if err != nil {
		t.Fatalf("RemoveOrphans with the plugin's token: %v", err)
	}
	// The first daemon pod is still terminating (no kubelet confirms it):
	// deleting it again is harmless.
	want := []string{string(share.Claim), string(share2.Claim), groupShare.ID(), ownGroupShare.ID()}
	slices.Sort(want)
	if !slices.Equal(removed, want) {
		t.Errorf("RemoveOrphans removed %v, want only this node's daemons %v", removed, want)
	}
	for name, wantGone := range map[string]bool{own.Name: true, ownGroup.Name: true, theirs.Name: false, theirsGroup.Name: false, "gpulink-controller-0": false} {
		err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, 30*time.Second, true, func(ctx context.Context) (bool, error) {
			p, err := admin.CoreV1().Pods(policyNS).Get(ctx, name, metav1.GetOptions{})
			gone := apierrors.IsNotFound(err) || (err == nil && p.DeletionTimestamp != nil)
			return gone == wantGone, nil
		})
		if err != nil {
			t.Errorf("pod %s: gone %v wanted", name, wantGone)
		}
	}
}
