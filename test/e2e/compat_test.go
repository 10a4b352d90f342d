//go:build e2e

package e2e_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	admissionregv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/compat/admission"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/e2e/gpuview"
	"github.com/gpulink/gpulink/test/localcluster"
)

// compatChart is the chart's translation webhook rendered for a webhook
// the API server reaches by URL (the local cluster has no kube-proxy).
type compatChart struct {
	secret  corev1.Secret
	config  corev1.ConfigMap
	webhook admissionregv1.MutatingWebhookConfiguration
}

func renderCompat(ctx context.Context, t *testing.T, port int) *compatChart {
	t.Helper()
	out, err := localcluster.HelmTemplate(ctx, "gpulink", chartNamespace,
		"--show-only", "templates/compat-webhook.yaml",
		"--set", fmt.Sprintf("compat.url=https://127.0.0.1:%d%s", port, admission.Path),
		"--set-json", `compat.tls.ipSANs=["127.0.0.1"]`,
		"--set", "compat.families.aliyun.enabled=true",
		"--set", "compat.families.tencent.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := localcluster.DecodeChart(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs.Secrets) != 1 || len(objs.ConfigMaps) != 1 || len(objs.Webhooks) != 1 ||
		len(objs.DeviceClasses)+len(objs.Policies)+len(objs.Bindings) > 0 {
		t.Fatalf("compat-webhook.yaml rendered %d Secrets, %d ConfigMaps, %d MutatingWebhookConfigurations and %d other objects; want one Secret, one ConfigMap and one MutatingWebhookConfiguration (no Service in url mode)",
			len(objs.Secrets), len(objs.ConfigMaps), len(objs.Webhooks), len(objs.DeviceClasses)+len(objs.Policies)+len(objs.Bindings))
	}
	c := &compatChart{secret: objs.Secrets[0], config: objs.ConfigMaps[0], webhook: objs.Webhooks[0]}
	return c
}

// TestCompatE2E runs pods written for device plugins, unchanged, on the real
// node: the controller serves the chart's translation webhook (TLS from the
// chart's generated Secret, families from its ConfigMap), the API server
// calls it by URL, and every row of the README's table gets GPUs (env and
// device nodes checked in the container), a pod mixing a ResourceClaim and
// nvidia.com/gpu too, bad values are refused with their name and value,
// and the templates are collected once the pods are gone.
func TestCompatE2E(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("the e2e tests run a real node (containerd, kubelet) and need root")
	}
	begin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	s := setupCompat(ctx, t, setupOptions{})
	t.Logf("gpulink and the translation webhook deployed %.1fs after the start", time.Since(begin).Seconds())
	s.template(ctx, t, "compat-user", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 1}, nil)

	t.Run("bad values are refused naming the resource and the value", func(t *testing.T) {
		for _, bad := range []struct {
			limits      map[string]string
			annotations map[string]string
			want        []string
		}{
			{limits: map[string]string{"nvidia.com/gpu": "0", "nvidia.com/gpumem": "1000"}, want: []string{"nvidia.com/gpu: 0", "nvidia.com/gpumem: 1000"}},
			{limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "60000"}, want: []string{"nvidia.com/gpumem: 60000", "more than any GPU"}},
			{limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpucores": "150"}, want: []string{"nvidia.com/gpucores: 150"}},
			{limits: map[string]string{"nvidia.com/gpu": "-1"}, want: []string{"nvidia.com/gpu", "-1", "negative"}},
			{limits: map[string]string{"nvidia.com/gpu": "1.5"}, want: []string{"nvidia.com/gpu", "1500m", "whole number"}},
			{limits: map[string]string{"tencent.com/vcuda-core": "150"}, want: []string{"tencent.com/vcuda-core: 150"}},
			// HAMi's task priority: 0 or 1, beside a GPU.
			{limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "2"}, want: []string{"nvidia.com/priority: 2", "0 (high) or 1 (low)"}},
			{limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "-1"}, want: []string{"nvidia.com/priority", "-1", "negative"}},
			{limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/priority": "0.5"}, want: []string{"nvidia.com/priority", "500m", "whole number"}},
			{limits: map[string]string{"nvidia.com/priority": "1"}, want: []string{"nvidia.com/priority: 1", "without a GPU"}},
			{limits: map[string]string{"nvidia.com/gpu": "1"}, annotations: map[string]string{compat.AnnotationUseGPUType: "A40;x"}, want: []string{compat.AnnotationUseGPUType, "A40;x"}},
			// The pod's own policy is binpack or spread (both accepted,
			// whatever the controller's flags); anything else is refused.
			{limits: map[string]string{"nvidia.com/gpu": "1"}, annotations: map[string]string{compat.AnnotationGPUPolicy: "random"}, want: []string{compat.AnnotationGPUPolicy, "random", "binpack or spread"}},
			{limits: map[string]string{"nvidia.com/gpu": "1"}, annotations: map[string]string{"hami.io/vgpu-mode": "mig"}, want: []string{"hami.io/vgpu-mode", "mig"}},
		} {
			pod := s.compatPod("bad", []compatContainer{{name: "workload", limits: bad.limits}})
			pod.Annotations = bad.annotations
			_, err := s.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if err == nil {
				t.Errorf("pod with %v %v was admitted", bad.limits, bad.annotations)
				_ = s.client.CoreV1().Pods(ns).Delete(ctx, "bad", metav1.DeleteOptions{})
				continue
			}
			for _, w := range bad.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("%v %v: error %q does not mention %q", bad.limits, bad.annotations, err, w)
				}
			}
		}
		list, err := s.client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{LabelSelector: compat.LabelManaged + "=true"})
		if err != nil || len(list.Items) != 0 {
			t.Errorf("refused pods left %d templates (%v)", len(list.Items), err)
		}
	})

	// Wave A: 6 whole GPUs and 3 shares on the 8 GPUs of the real node.
	s.runCompatWave(ctx, t, "the device plugin, gputopology, gpu-manager and HAMi rows run on the real node", []compatCase{
		{name: "dp-two", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpu": "2"}, whole: 2}}},
		{name: "aliyun-one", containers: []compatContainer{{name: "workload", limits: map[string]string{"aliyun.com/gpu": "1"}, whole: 1}}},
		{name: "tencent-whole", containers: []compatContainer{{name: "workload", limits: map[string]string{"tencent.com/vcuda-core": "100"}, whole: 1}}},
		{name: "mixed", userClaim: true, containers: []compatContainer{{name: "workload", whole: 1}, {name: "second", limits: map[string]string{"nvidia.com/gpu": "1"}, whole: 1}}},
		{name: "hami-share", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}, shareMiB: 3000, shareCores: 30}}},
		{name: "tencent-share", containers: []compatContainer{{name: "workload", limits: map[string]string{"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "20"}, shareMiB: 5120, shareCores: 30}}},
		{name: "hami-percent", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "50"}, shareMiB: 24576, shareCores: 25}}},
	})
	s.deletePodsAndWait(ctx, t)
	// Wave B: two containers, each with its own GPU, and a regular init
	// container that uses the first one's claim (it has finished when that
	// starts: the pod holds 2 GPUs, not 3, as with the device plugin);
	// HAMi's use-gputype annotation picks the real node's A40s.
	s.runCompatWave(ctx, t, "init containers reuse, several containers get their own GPUs", []compatCase{
		{name: "multi", annotations: map[string]string{compat.AnnotationUseGPUType: "A40"}, containers: []compatContainer{
			{name: "setup", init: true, limits: map[string]string{"nvidia.com/gpu": "1"}, whole: 1, claimOf: "workload"},
			{name: "workload", limits: map[string]string{"nvidia.com/gpu": "1"}, whole: 1},
			{name: "second", limits: map[string]string{"nvidia.com/gpu": "1"}, whole: 1},
		}},
		{name: "hami-mem-only", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpumem": "2000"}, shareMiB: 2000, shareCores: 25}}},
		// HAMi's low task priority: admitted, taken off the pod, and the
		// container's MPS client priority is below normal.
		{name: "hami-low-priority", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "20", "nvidia.com/priority": "1"}, shareMiB: 2000, shareCores: 20, priority: "1"}}},
		// HAMi's two GPUs with 8000Mi each under the default MPS share
		// class: one claim, one MPS daemon serving both GPUs.
		{name: "mps-two", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"}, shareMiB: 8000, shareCores: 25, shares: 2}}},
	})
	s.deletePodsAndWait(ctx, t)
	// The same two-GPU row with the share class switched to HAMi-core:
	// HAMi-core limits each GPU of the process.
	s.hamiShareClass(ctx, t)
	s.runCompatWave(ctx, t, "two GPUs with 8000Mi each under a HAMi-core share class", []compatCase{
		{name: "hami-two", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"}, shareMiB: 8000, shareCores: 25, shares: 2, hami: true}}},
		// HAMi's high priority (0, not "unset") in HAMi-core's variable.
		{name: "hami-high-priority", containers: []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpumem": "2000", "nvidia.com/priority": "0"}, shareMiB: 2000, shareCores: 25, hami: true, priority: "0"}}},
	})
	s.deletePodsAndWait(ctx, t)
	t.Run("the translated templates are collected once their pods are gone", func(t *testing.T) {
		// A template of the user's own is never collected.
		s.template(ctx, t, "compat-user-kept", resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, Count: 1}, nil)
		list, err := s.client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{LabelSelector: compat.LabelManaged + "=true"})
		if err != nil || len(list.Items) == 0 {
			t.Fatalf("no translated templates left to collect (%v)", err)
		}
		t.Logf("%d translated templates wait for collection", len(list.Items))
		start := time.Now()
		err = wait.PollUntilContextTimeout(ctx, time.Second, 2*time.Minute, true, func(ctx context.Context) (bool, error) {
			list, err := s.client.ResourceV1().ResourceClaimTemplates(ns).List(ctx, metav1.ListOptions{LabelSelector: compat.LabelManaged + "=true"})
			return err == nil && len(list.Items) == 0, err
		})
		if err != nil {
			t.Fatalf("templates left: %v", err)
		}
		t.Logf("templates collected %.1fs after the pods were gone (grace 10s)", time.Since(start).Seconds())
		if _, err := s.client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, "compat-user-kept", metav1.GetOptions{}); err != nil {
			t.Errorf("the user's own template: %v", err)
		}
	})
	t.Logf("compat e2e took %.1fs", time.Since(begin).Seconds())
}

// setupCompat is setupOpts with the chart's translation webhook: the
// controller serves it (by URL: the local cluster has no kube-proxy) with
// the chart's certificate and compat ConfigMap, and the webhook is in
// effect when it returns.
func setupCompat(ctx context.Context, t *testing.T, o setupOptions) *suite {
	t.Helper()
	port := localcluster.FreePort(t)
	chart := renderCompat(ctx, t, port)
	o.controllerArgs = append(o.controllerArgs, compatControllerArgs(t, chart, port)...)
	s := setupOpts(ctx, t, o)
	if _, err := s.client.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &chart.webhook, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitWebhook(ctx, t, s)
	return s
}

// compatControllerArgs writes the chart's certificate and compat
// ConfigMap for a controller process and returns its flags to serve the
// translation webhook on 127.0.0.1:port with them.
func compatControllerArgs(t *testing.T, chart *compatChart, port int) []string {
	t.Helper()
	files := t.TempDir()
	for name, data := range map[string][]byte{
		"tls.crt":     chart.secret.Data["tls.crt"],
		"tls.key":     chart.secret.Data["tls.key"],
		"compat.yaml": []byte(chart.config.Data["compat.yaml"]),
	} {
		if err := os.WriteFile(filepath.Join(files, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := compat.Load(filepath.Join(files, "compat.yaml")); err != nil {
		t.Fatalf("the chart's compat ConfigMap: %v", err)
	}
	if ca := chart.webhook.Webhooks[0].ClientConfig.CABundle; !bytes.Equal(ca, chart.secret.Data["ca.crt"]) {
		t.Fatalf("webhook caBundle %q is not the Secret's ca.crt", base64.StdEncoding.EncodeToString(ca))
	}
	return []string{
		fmt.Sprintf("--webhook-address=127.0.0.1:%d", port),
		"--webhook-cert-dir=" + files,
		"--compat-config=" + filepath.Join(files, "compat.yaml"),
		"--compat-template-grace=10s",
	}
}

// hamiShareClass switches the share class to HAMi-core. The controller
// copies the class's config into each allocation from its informer; the
// pods created next go through admission and the scheduling gate first.
func (s *suite) hamiShareClass(ctx context.Context, t *testing.T) {
	t.Helper()
	dc, err := s.client.ResourceV1().DeviceClasses().Get(ctx, driver.DeviceClassShare, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	dc.Spec.Config = []resourceapi.DeviceClassConfiguration{{DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
		Driver: driver.Name, Parameters: runtime.RawExtension{Raw: []byte(`{"apiVersion":"gpu.gpulink.dev/v1alpha1","kind":"GpuConfig","sharing":{"strategy":"HAMiCore"}}`)}}}}}
	if _, err := s.client.ResourceV1().DeviceClasses().Update(ctx, dc, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// waitWebhook waits until the API server calls the webhook: a dry-run pod
// asking for nvidia.com/gpu comes back with a claim.
func waitWebhook(ctx context.Context, t *testing.T, s *suite) {
	t.Helper()
	start := time.Now()
	var last error
	err := wait.PollUntilContextTimeout(ctx, 250*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		p, err := s.client.CoreV1().Pods(ns).Create(ctx, s.compatPod("probe", []compatContainer{{name: "workload", limits: map[string]string{"nvidia.com/gpu": "1"}}}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			last = err
			return false, nil
		}
		return len(p.Spec.ResourceClaims) == 1, nil
	})
	if err != nil {
		t.Fatalf("the translation webhook never took effect: %v (last error: %v)", err, last)
	}
	t.Logf("translation webhook in effect after %.1fs", time.Since(start).Seconds())
}

// sameClaim tells whether two containers of a case share one claim.
func sameClaim(c compatCase, a, b string) bool {
	for _, ctr := range c.containers {
		if (ctr.name == a && ctr.claimOf == b) || (ctr.name == b && ctr.claimOf == a) {
			return true
		}
	}
	return false
}

type compatContainer struct {
	name   string
	init   bool
	limits map[string]string
	// What the container must get: whole GPUs, or one share.
	whole      int
	shareMiB   int64
	shareCores int64
	// shares is the number of shares (default 1), each on its own GPU;
	// hami: limited by HAMi-core's env instead of MPS.
	shares int
	hami   bool
	// priority is the task priority the container must see ("": none).
	priority string
	// claimOf names the container whose claim this regular init
	// container uses (it finishes before that one starts, and the device
	// plugin hands its devices on the same way).
	claimOf string
}

type compatCase struct {
	name        string
	annotations map[string]string
	// userClaim: the first container uses a claim from the user's
	// template compat-user (one whole GPU).
	userClaim  bool
	containers []compatContainer
}

func (s *suite) compatPod(name string, cs []compatContainer) *corev1.Pod {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: map[string]string{"app": "gpulink-e2e"}},
		Spec: corev1.PodSpec{
			HostNetwork:                   true,
			TerminationGracePeriodSeconds: ptr.To[int64](1),
			NodeSelector:                  map[string]string{corev1.LabelHostname: s.realNode},
		},
	}
	for _, c := range cs {
		limits := corev1.ResourceList{}
		for k, v := range c.limits {
			limits[corev1.ResourceName(k)] = resource.MustParse(v)
		}
		ctr := corev1.Container{Name: c.name, Image: localcluster.WorkloadImage, ImagePullPolicy: corev1.PullNever,
			Resources: corev1.ResourceRequirements{Limits: limits}, Env: slices.Clone(s.workloadEnv)}
		if c.init {
			ctr.Env = append(ctr.Env, corev1.EnvVar{Name: "GPULINK_WORKLOAD_EXIT", Value: "1"})
			pod.Spec.InitContainers = append(pod.Spec.InitContainers, ctr)
		} else {
			pod.Spec.Containers = append(pod.Spec.Containers, ctr)
		}
	}
	return pod
}

// runCompatWave creates the pods, checks what admission made of them, and
// then checks each pod concurrently on the real node.
func (s *suite) runCompatWave(ctx context.Context, t *testing.T, title string, cases []compatCase) {
	t.Run(title, func(t *testing.T) {
		for _, c := range cases {
			pod := s.compatPod(c.name, c.containers)
			pod.Annotations = c.annotations
			if c.userClaim {
				pod.Spec.ResourceClaims = []corev1.PodResourceClaim{{Name: "user", ResourceClaimTemplateName: ptr.To("compat-user")}}
				pod.Spec.Containers[0].Resources.Claims = []corev1.ResourceClaim{{Name: "user"}}
			}
			created, err := s.client.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{})
			if err != nil {
				t.Fatalf("creating pod %s: %v", c.name, err)
			}
			if n := gated(created); n != 1 {
				t.Errorf("pod %s created with gates %v, want %s once", c.name, created.Spec.SchedulingGates, driver.SchedulingGate)
			}
			for _, cs := range [][]corev1.Container{created.Spec.InitContainers, created.Spec.Containers} {
				for _, ctr := range cs {
					for name := range ctr.Resources.Limits {
						if strings.Contains(string(name), "/") {
							t.Errorf("pod %s container %s keeps %s in its limits", c.name, ctr.Name, name)
						}
					}
				}
			}
			t.Logf("pod %s admitted: %s", c.name, created.Annotations[compat.AnnotationTranslated])
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				s.checkCompatPod(ctx, t, c)
			})
		}
	})
}

// checkCompatPod waits until the pod runs and every container printed
// READY, then checks each container's devices against its claims.
func (s *suite) checkCompatPod(ctx context.Context, t *testing.T, c compatCase) {
	pods := s.client.CoreV1().Pods(ns)
	logs := map[string]string{}
	var pod *corev1.Pod
	var state string
	err := wait.PollUntilContextTimeout(ctx, time.Second, allocTimeout+runTimeout, true, func(ctx context.Context) (bool, error) {
		if err := s.alive(); err != nil {
			return false, err
		}
		p, err := pods.Get(ctx, c.name, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		pod = p
		if p.Status.Phase != corev1.PodRunning {
			state = fmt.Sprintf("phase %s, gates %v", p.Status.Phase, p.Spec.SchedulingGates)
			return false, nil
		}
		for _, ctr := range c.containers {
			if strings.Contains(logs[ctr.name], "\nREADY") {
				continue
			}
			raw, err := pods.GetLogs(c.name, &corev1.PodLogOptions{Container: ctr.name}).DoRaw(ctx)
			if err != nil {
				log, ferr := localcluster.ReadPodLogFile(s.cluster.PodLogDir(), p, ctr.name)
				if ferr != nil {
					state = fmt.Sprintf("log of %s: %v", ctr.name, err)
					return false, nil
				}
				raw = []byte(log)
			}
			logs[ctr.name] = string(raw)
			if !strings.Contains(logs[ctr.name], "\nREADY") {
				state = "container " + ctr.name + " not READY"
				return false, nil
			}
		}
		return true, nil
	})
	if err != nil {
		t.Fatalf("pod %s: %s: %v\n%s", c.name, state, err, describePod(ctx, s.client, ns, c.name))
	}
	// The webhook creates nothing: the controller's leader made the pod's
	// templates from its annotation, each named by its stored spec's hash.
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName == nil || !compat.IsTemplateName(*rc.ResourceClaimTemplateName) {
			continue
		}
		tmpl, err := s.client.ResourceV1().ResourceClaimTemplates(ns).Get(ctx, *rc.ResourceClaimTemplateName, metav1.GetOptions{})
		if err != nil {
			t.Errorf("pod %s: template %s: %v", c.name, *rc.ResourceClaimTemplateName, err)
			continue
		}
		if err := compat.CheckTemplateName(tmpl.Name, tmpl.Spec.Spec); err != nil {
			t.Errorf("pod %s: template %s: %v", c.name, tmpl.Name, err)
		}
	}
	t.Logf("pod %s: every container READY %.0fs after the pod was created", c.name, time.Since(pod.CreationTimestamp.Time).Seconds())
	claimOf := map[string]string{}
	for _, st := range pod.Status.ResourceClaimStatuses {
		if st.ResourceClaimName != nil {
			claimOf[st.Name] = *st.ResourceClaimName
		}
	}
	node := s.nodes(ctx, t)[s.realNode]
	seen := map[string]string{}
	for _, want := range c.containers {
		var spec corev1.Container
		for _, ctr := range append(slices.Clone(pod.Spec.InitContainers), pod.Spec.Containers...) {
			if ctr.Name == want.name {
				spec = ctr
			}
		}
		if want.claimOf != "" {
			for _, ctr := range pod.Spec.Containers {
				if ctr.Name == want.claimOf && !slices.Equal(ctr.Resources.Claims, spec.Resources.Claims) {
					t.Errorf("pod %s: init container %s uses claims %v, want those of %s: %v", c.name, want.name, spec.Resources.Claims, ctr.Name, ctr.Resources.Claims)
				}
			}
		}
		h := holding{pod: pod, log: logs[want.name]}
		var shareClaim string // UID of the claim holding the shares
		for _, rc := range spec.Resources.Claims {
			claim, err := s.client.ResourceV1().ResourceClaims(ns).Get(ctx, claimOf[rc.Name], metav1.GetOptions{})
			if err != nil {
				t.Fatalf("pod %s claim %s: %v", c.name, rc.Name, err)
			}
			held, allocated, err := gpuview.ClaimDevices(claim)
			if err != nil || !allocated {
				t.Fatalf("claim %s: allocated %t, %v", claim.Name, allocated, err)
			}
			if held.Node != s.realNode {
				t.Errorf("claim %s on %s, want %s", claim.Name, held.Node, s.realNode)
			}
			h.Devices = append(h.Devices, held.Devices...)
			h.Shares = append(h.Shares, held.Shares...)
			if len(held.Shares) > 0 {
				shareClaim = string(claim.UID)
			}
		}
		for _, d := range h.Devices {
			if other, dup := seen[d]; dup && want.shareMiB == 0 && !sameClaim(c, other, want.name) {
				t.Errorf("pod %s: containers %s and %s both hold %s", c.name, other, want.name, d)
			}
			seen[d] = want.name
		}
		if want.whole > 0 && (len(h.Devices) != want.whole || len(h.Shares) != 0) {
			t.Errorf("pod %s container %s holds %v (%d shares), want %d whole GPUs", c.name, want.name, h.Devices, len(h.Shares), want.whole)
		}
		s.checkDevices(t, node, h)
		if want.shareMiB > 0 {
			shares := max(want.shares, 1)
			if len(h.Shares) != shares {
				t.Fatalf("pod %s container %s holds %d shares, want %d", c.name, want.name, len(h.Shares), shares)
			}
			for _, sh := range h.Shares {
				mem, cores := sh.ConsumedCapacity[driver.CapacityMemory], sh.ConsumedCapacity[driver.CapacityCores]
				if mem.Value() != want.shareMiB<<20 || cores.Value() != want.shareCores {
					t.Errorf("pod %s: share consumed memory %s cores %s, want %dMi and %d", c.name, mem.String(), cores.String(), want.shareMiB, want.shareCores)
				}
			}
			if len(h.Devices) != shares || len(slices.Compact(slices.Sorted(slices.Values(h.Devices)))) != shares {
				t.Errorf("pod %s container %s: shares on %v, want %d different GPUs", c.name, want.name, h.Devices, shares)
			}
			// One MPS daemon for the claim, serving all its GPUs: a limit
			// for every device ordinal, one pipe directory.
			limits := make([]string, shares)
			for i := range limits {
				limits[i] = fmt.Sprintf("%d=%dM", i, want.shareMiB)
			}
			wantEnv := map[string]string{
				"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT":  strings.Join(limits, ","),
				"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": fmt.Sprint(want.shareCores),
				"CUDA_MPS_PIPE_DIRECTORY":           filepath.Join(s.mpsRoot, shareClaim, "pipe"),
			}
			if want.hami {
				// HAMi-core limits every GPU of the process on its own.
				wantEnv = map[string]string{}
				for i := range shares {
					wantEnv[fmt.Sprintf("CUDA_DEVICE_MEMORY_LIMIT_%d", i)] = fmt.Sprintf("%dm", want.shareMiB)
					wantEnv[fmt.Sprintf("CUDA_DEVICE_SM_LIMIT_%d", i)] = fmt.Sprint(want.shareCores)
				}
			}
			if want.priority != "" {
				wantEnv["GPULINK_SHARE_PRIORITY"] = want.priority
				if want.hami {
					wantEnv["CUDA_TASK_PRIORITY"] = want.priority
				} else {
					wantEnv["CUDA_MPS_CLIENT_PRIORITY"] = want.priority
				}
			}
			for k, v := range wantEnv {
				if got, ok := env(h.log, k); !ok || got != v {
					t.Errorf("pod %s: %s=%q (set %t), want %q", c.name, k, got, ok, v)
				}
			}
		}
		t.Logf("pod %s container %s: %s on %s", c.name, want.name, gpuview.Indexes(h.Devices), s.realNode)
	}
	// The Normal event saying what the pod was translated into.
	err = wait.PollUntilContextTimeout(ctx, time.Second, time.Minute, true, func(ctx context.Context) (bool, error) {
		evs, err := s.client.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=" + c.name})
		if err != nil {
			return false, err
		}
		for _, e := range evs.Items {
			if e.Reason == admission.ReasonTranslated && e.Type == corev1.EventTypeNormal && e.InvolvedObject.UID == pod.UID {
				return true, nil
			}
		}
		return false, nil
	})
	if err != nil {
		t.Errorf("pod %s: no %s event: %v", c.name, admission.ReasonTranslated, err)
	}
}
