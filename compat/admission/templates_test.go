package admission

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"

	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver"
)

// makerEnv runs a TemplateMaker on a fake API server.
type makerEnv struct {
	t      *testing.T
	ctx    context.Context
	client *fake.Clientset
	rec    *events.FakeRecorder
}

func startMaker(t *testing.T, quotas ...*corev1.ResourceQuota) *makerEnv {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e := &makerEnv{t: t, ctx: ctx, client: fake.NewClientset(), rec: events.NewFakeRecorder(100)}
	factory := informers.NewSharedInformerFactory(e.client, 0)
	pods := factory.Core().V1().Pods().Informer()
	templates := factory.Resource().V1().ResourceClaimTemplates().Informer()
	m, err := NewTemplateMaker(TemplateMakerConfig{
		Client: e.client, Config: compat.DefaultConfig(), Recorder: e.rec, Grace: time.Minute,
		Quota: NewQuotaGuard(quotaLister(quotas...), &compat.Translator{Config: compat.DefaultConfig()}),
	}, pods, templates)
	if err != nil {
		t.Fatal(err)
	}
	factory.Start(ctx.Done())
	t.Cleanup(factory.Shutdown)
	if !cache.WaitForCacheSync(ctx.Done(), pods.HasSynced, templates.HasSynced) {
		t.Fatal("caches did not sync")
	}
	done := make(chan struct{})
	go func() { m.Run(ctx, 2); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return e
}

// translated returns the pod the webhook makes of a pod asking for limits.
func translated(t *testing.T, name string, limits map[string]string) *corev1.Pod {
	t.Helper()
	tr := &compat.Translator{Config: compat.DefaultConfig(), Inventory: staticSizes{40 << 30}}
	res, err := tr.Translate(gpuPod(name, limits))
	if err != nil || res == nil {
		t.Fatalf("translating %v: %v", limits, err)
	}
	return res.Pod
}

func templateOf(p *corev1.Pod) string { return *p.Spec.ResourceClaims[0].ResourceClaimTemplateName }

func (e *makerEnv) createPod(p *corev1.Pod) {
	e.t.Helper()
	p.UID = types.UID("uid-" + p.Name)
	if _, err := e.client.CoreV1().Pods(p.Namespace).Create(e.ctx, p, metav1.CreateOptions{}); err != nil {
		e.t.Fatal(err)
	}
}

func (e *makerEnv) waitTemplate(name string) *resourceapi.ResourceClaimTemplate {
	e.t.Helper()
	var got *resourceapi.ResourceClaimTemplate
	err := wait.PollUntilContextTimeout(e.ctx, 10*time.Millisecond, 10*time.Second, true, func(ctx context.Context) (bool, error) {
		t, err := e.client.ResourceV1().ResourceClaimTemplates("team").Get(ctx, name, metav1.GetOptions{})
		got = t
		return err == nil, nil
	})
	if err != nil {
		e.t.Fatalf("template %s never created", name)
	}
	return got
}

// waitEvent returns the first recorded event containing all of want.
func (e *makerEnv) waitEvent(want ...string) string {
	e.t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		select {
		case ev := <-e.rec.Events:
			ok := true
			for _, w := range want {
				ok = ok && strings.Contains(ev, w)
			}
			if ok {
				return ev
			}
		case <-timeout:
			e.t.Fatalf("no event mentioning %q", want)
			return ""
		}
	}
}

// settle gives the maker time to act on what it was given; used before
// asserting that something did not happen.
func (e *makerEnv) settle() { time.Sleep(300 * time.Millisecond) }

func (e *makerEnv) templates() []string {
	list, _ := e.client.ResourceV1().ResourceClaimTemplates("team").List(e.ctx, metav1.ListOptions{})
	var out []string
	for _, t := range list.Items {
		out = append(out, t.Name)
	}
	return out
}

// The leader creates a translated pod's template from the pod's annotation,
// under the name its spec hashes to, and again when it is deleted while
// the pod needs it.
func TestTemplateMakerCreatesForExistingPods(t *testing.T) {
	e := startMaker(t)
	p := translated(t, "train", map[string]string{"nvidia.com/gpu": "2"})
	e.createPod(p)
	tmpl := e.waitTemplate(templateOf(p))
	if tmpl.Labels[compat.LabelManaged] != "true" || tmpl.Spec.Labels[compat.LabelManaged] != "true" || tmpl.Annotations[AnnotationLastAdmitted] == "" {
		t.Errorf("template metadata %+v", tmpl.ObjectMeta)
	}
	if err := compat.CheckTemplateName(tmpl.Name, tmpl.Spec.Spec); err != nil || tmpl.Spec.Spec.Devices.Requests[0].Exactly.Count != 2 {
		t.Errorf("template spec %+v: %v", tmpl.Spec.Spec, err)
	}
	if err := e.client.ResourceV1().ResourceClaimTemplates("team").Delete(e.ctx, tmpl.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitTemplate(tmpl.Name)
}

// A template squatting on a pod's template name with another spec is left
// as it is, not used, and the pod says which template to delete.
func TestTemplateMakerRefusesSquatter(t *testing.T) {
	e := startMaker(t)
	p := translated(t, "victim", map[string]string{"nvidia.com/gpu": "1"})
	name := templateOf(p)
	eight := resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: compat.RequestName,
		Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: 8}}}}}
	squat := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", Labels: map[string]string{compat.LabelManaged: "true"}},
		Spec:       resourceapi.ResourceClaimTemplateSpec{Spec: eight},
	}
	if _, err := e.client.ResourceV1().ResourceClaimTemplates("team").Create(e.ctx, squat, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createPod(p)
	ev := e.waitEvent("Warning", ReasonTemplateConflict, "team/"+name, "Delete the template")
	t.Logf("event: %s", ev)
	got, err := e.client.ResourceV1().ResourceClaimTemplates("team").Get(e.ctx, name, metav1.GetOptions{})
	if err != nil || got.Spec.Spec.Devices.Requests[0].Exactly.Count != 8 || got.Annotations[AnnotationLastAdmitted] != "" {
		t.Errorf("the squatter's template was changed or stamped: %+v, %v", got, err)
	}
}

// Forged annotations: an entry under a name that is not its spec's hash,
// an entry of another class, and an entry the pod does not reference
// create nothing.
func TestTemplateMakerRefusesForgedEntries(t *testing.T) {
	e := startMaker(t)
	p := translated(t, "forged", map[string]string{"nvidia.com/gpu": "1"})
	name := templateOf(p)
	specs, err := compat.DecodeTemplates(p.Annotations[compat.AnnotationTemplates])
	if err != nil {
		t.Fatal(err)
	}
	one := specs[name]
	// 8 GPUs under the 1-GPU name.
	eight := *one.DeepCopy()
	eight.Devices.Requests[0].Exactly.Count = 8
	// Another driver's class under its own hash name, referenced too.
	nic := *one.DeepCopy()
	nic.Devices.Requests[0].Exactly.DeviceClassName = "nic.example.com"
	nicName, _ := compat.TemplateName(nic)
	// A valid spec the pod does not reference.
	two := *one.DeepCopy()
	two.Devices.Requests[0].Exactly.Count = 2
	twoName, _ := compat.TemplateName(two)
	enc, err := compat.EncodeTemplates(map[string]resourceapi.ResourceClaimTemplateSpec{name: {Spec: eight}, nicName: {Spec: nic}, twoName: {Spec: two}})
	if err != nil {
		t.Fatal(err)
	}
	p.Annotations[compat.AnnotationTemplates] = enc
	p.Spec.ResourceClaims = append(p.Spec.ResourceClaims, corev1.PodResourceClaim{Name: "nic", ResourceClaimTemplateName: &nicName})
	e.createPod(p)
	e.waitEvent("Warning", ReasonTemplateRefused, name, "hashes to")
	e.settle()
	if got := e.templates(); len(got) != 0 {
		t.Errorf("forged entries created %v", got)
	}
}

// In a namespace whose quota limits nvidia.com/gpu without a class quota,
// the leader creates nothing either (a pod may carry the annotation
// without having passed the webhook).
func TestTemplateMakerHonoursQuota(t *testing.T) {
	e := startMaker(t, quota("gpus", "team", map[string]string{"requests.nvidia.com/gpu": "1"}))
	p := translated(t, "over", map[string]string{"nvidia.com/gpu": "8"})
	e.createPod(p)
	e.waitEvent("Warning", ReasonTemplateRefused, "ResourceQuota gpus")
	e.settle()
	if got := e.templates(); len(got) != 0 {
		t.Errorf("templates %v created past the quota", got)
	}
	if _, err := e.client.ResourceV1().ResourceClaimTemplates("team").Get(e.ctx, templateOf(p), metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("template: %v", err)
	}
}

// A pod carrying a share's template in its annotation, in a namespace
// whose quota limits GPU memory, gets no template from the leader either,
// whatever class quota the namespace has.
func TestTemplateMakerKeepsMemoryQuota(t *testing.T) {
	e := startMaker(t, quota("gpumem", "team", map[string]string{"requests.nvidia.com/gpumem": "4096"}),
		quota("shares", "team", map[string]string{driver.DeviceClassShare + ".deviceclass.resource.k8s.io/devices": "2"}))
	p := translated(t, "big", map[string]string{"nvidia.com/gpu": "1", "nvidia.com/gpumem": "40000"})
	e.createPod(p)
	e.waitEvent("Warning", ReasonTemplateRefused, "requests.nvidia.com/gpumem: 4096")
	e.settle()
	if got := e.templates(); len(got) != 0 {
		t.Errorf("templates %v created past the memory quota", got)
	}
}
