package admission

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	resourcelisters "k8s.io/client-go/listers/resource/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/events"
	"k8s.io/client-go/util/workqueue"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/compat"
)

// AnnotationLastAdmitted on a template is when the leader last saw a new
// pod using it. The garbage collector keeps an unreferenced template for
// Grace after that, so that a burst of short pods of one shape does not
// create and delete its template again for every pod.
const AnnotationLastAdmitted = "gpu.gpulink.dev/last-admitted"

// fieldManager names gpulink's compatibility layer in managedFields.
const fieldManager = "gpulink-compat"

// Event reasons on translated pods.
const (
	// ReasonTemplateConflict: a template exists under the pod's
	// template name whose spec does not hash to that name (someone else
	// made it); gpulink does not use it.
	ReasonTemplateConflict = "CompatTemplateConflict"
	// ReasonTemplateRefused: the leader did not create a template the
	// pod's annotation names (not a translation's, over quota, invalid).
	ReasonTemplateRefused = "CompatTemplateRefused"
	actionCreateTemplate  = "CreateTemplate"
)

// podTemplateIndex indexes translated pods by namespace/template name.
const podTemplateIndex = "gpulink-compat-template"

// TemplateMaker runs in the leader: it creates the ResourceClaimTemplates
// that translated pods name in compat.AnnotationTemplates, for pods that
// exist, in the pod's own namespace, and only where the template name is
// the hash of the spec (compat.Config.CheckTemplateEntry). A forged
// annotation therefore creates at most a template its namespace's users
// could have created themselves, never one under another shape's name.
//
// kube-controller-manager's resourceclaim controller creates the pod's
// claims once the template exists (it watches templates and retries); the
// pod is gated meanwhile. A template found under the name whose stored
// spec does not hash to it is not used: the pod gets a
// ReasonTemplateConflict Warning (and the gpulink controller refuses to
// allocate the claim made from it).
type TemplateMaker struct {
	client    kubernetes.Interface
	config    compat.Config
	quota     QuotaChecker
	rec       events.EventRecorder
	grace     time.Duration
	now       func() time.Time
	pods      corelisters.PodLister
	podIndex  cache.Indexer
	templates resourcelisters.ResourceClaimTemplateLister
	queue     workqueue.TypedRateLimitingInterface[string]

	mu     sync.Mutex
	warned map[types.UID]map[string]bool
}

// TemplateMakerConfig configures NewTemplateMaker.
type TemplateMakerConfig struct {
	Client kubernetes.Interface
	Config compat.Config
	// Quota, when set, refuses templates whose claims a namespace's quota
	// on the device-plugin names would not count (as the webhook does, for
	// pods that carry the annotation without having been translated).
	Quota    QuotaChecker
	Recorder events.EventRecorder
	// Grace: see AnnotationLastAdmitted; the stamp is refreshed once a
	// quarter of it has passed.
	Grace time.Duration
	Now   func() time.Time
}

// NewTemplateMaker watches an informer of translated pods (label selector
// compat.LabelManaged=true) and one of all ResourceClaimTemplates (a
// template that someone else created under a translated name must be seen
// too). It adds an indexer to the pod informer, so it must be called
// before the informer starts.
func NewTemplateMaker(cfg TemplateMakerConfig, pods, templates cache.SharedIndexInformer) (*TemplateMaker, error) {
	m := &TemplateMaker{
		client: cfg.Client, config: cfg.Config, quota: cfg.Quota, rec: cfg.Recorder, grace: cfg.Grace, now: cfg.Now,
		pods:      corelisters.NewPodLister(pods.GetIndexer()),
		podIndex:  pods.GetIndexer(),
		templates: resourcelisters.NewResourceClaimTemplateLister(templates.GetIndexer()),
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "gpulink-compat-templates"}),
		warned: map[types.UID]map[string]bool{},
	}
	if m.now == nil {
		m.now = time.Now
	}
	if err := pods.AddIndexers(cache.Indexers{podTemplateIndex: podTemplateKeys}); err != nil {
		return nil, fmt.Errorf("indexing translated pods by template: %w", err)
	}
	if _, err := pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    m.enqueuePod,
		UpdateFunc: func(_, o any) { m.enqueuePod(o) },
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			if p, ok := o.(*corev1.Pod); ok {
				m.mu.Lock()
				delete(m.warned, p.UID)
				m.mu.Unlock()
			}
		},
	}); err != nil {
		return nil, fmt.Errorf("watching translated pods: %w", err)
	}
	// A template that appears, changes or goes brings back the pods that
	// use it: a deleted one is created again for them, a foreign one gets
	// them a Warning.
	if _, err := templates.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    m.enqueueTemplateUsers,
		UpdateFunc: func(_, o any) { m.enqueueTemplateUsers(o) },
		DeleteFunc: m.enqueueTemplateUsers,
	}); err != nil {
		return nil, fmt.Errorf("watching ResourceClaimTemplates: %w", err)
	}
	return m, nil
}

// podTemplateKeys are the namespace/name keys of the translated templates
// a pod references.
func podTemplateKeys(o any) ([]string, error) {
	p, ok := o.(*corev1.Pod)
	if !ok {
		return nil, nil
	}
	var keys []string
	for _, rc := range p.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName != nil && compat.IsTemplateName(*rc.ResourceClaimTemplateName) {
			keys = append(keys, p.Namespace+"/"+*rc.ResourceClaimTemplateName)
		}
	}
	return keys, nil
}

func (m *TemplateMaker) enqueuePod(o any) {
	if key, err := cache.MetaNamespaceKeyFunc(o); err == nil {
		m.queue.Add(key)
	}
}

func (m *TemplateMaker) enqueueTemplateUsers(o any) {
	if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
		o = d.Obj
	}
	t, ok := o.(*resourceapi.ResourceClaimTemplate)
	if !ok || !compat.IsTemplateName(t.Name) {
		return
	}
	users, err := m.podIndex.ByIndex(podTemplateIndex, t.Namespace+"/"+t.Name)
	if err != nil {
		return
	}
	for _, u := range users {
		m.enqueuePod(u)
	}
}

// Run processes pods with workers goroutines until ctx ends. The informers
// must have synced.
func (m *TemplateMaker) Run(ctx context.Context, workers int) {
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() { wait.UntilWithContext(ctx, m.work, time.Second) })
	}
	<-ctx.Done()
	m.queue.ShutDown()
	wg.Wait()
}

func (m *TemplateMaker) work(ctx context.Context) {
	for {
		key, quit := m.queue.Get()
		if quit {
			return
		}
		err := m.sync(ctx, key)
		if err == nil {
			m.queue.Forget(key)
		} else {
			klog.FromContext(ctx).Error(err, "Creating the translated ResourceClaimTemplates of a pod", "pod", key)
			m.queue.AddRateLimited(key)
		}
		m.queue.Done(key)
	}
}

// sync creates the templates one pod needs. Errors worth retrying are
// returned; refusals are Warning events on the pod.
func (m *TemplateMaker) sync(ctx context.Context, key string) error {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return nil
	}
	pod, err := m.pods.Pods(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("reading pod %s from cache: %w", key, err)
	}
	if pod.DeletionTimestamp != nil || pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return nil
	}
	raw, ok := pod.Annotations[compat.AnnotationTemplates]
	if !ok {
		return nil
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KObj(pod))
	specs, err := compat.DecodeTemplates(raw)
	if err != nil {
		m.warn(pod, ReasonTemplateRefused, "annotation", "not creating its templates: %v", err)
		return nil
	}
	referenced := map[string]bool{}
	for _, rc := range pod.Spec.ResourceClaims {
		if rc.ResourceClaimTemplateName != nil {
			referenced[*rc.ResourceClaimTemplateName] = true
		}
	}
	names := make([]string, 0, len(specs))
	for n := range specs {
		names = append(names, n)
	}
	sort.Strings(names)
	var errs []error
	for _, tn := range names {
		spec := specs[tn]
		if !referenced[tn] {
			// Nothing would use it: a pod can only make the leader create
			// templates it claims from.
			logger.V(2).Info("Not creating a template the pod does not reference", "template", tn)
			continue
		}
		if err := m.config.CheckTemplateEntry(tn, spec); err != nil {
			m.warn(pod, ReasonTemplateRefused, tn, "not creating ResourceClaimTemplate %s/%s named in annotation %s: %v", ns, tn, compat.AnnotationTemplates, err)
			continue
		}
		if m.quota != nil {
			if err := m.quota.Check(ns, []resourceapi.ResourceClaimSpec{spec}); err != nil {
				if !isQuotaError(err) {
					errs = append(errs, err)
					continue
				}
				m.warn(pod, ReasonTemplateRefused, tn, "not creating ResourceClaimTemplate %s/%s: %v", ns, tn, err)
				continue
			}
		}
		if err := m.ensure(ctx, pod, tn, spec); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// ensure creates the template or checks and refreshes the existing one.
func (m *TemplateMaker) ensure(ctx context.Context, pod *corev1.Pod, name string, spec resourceapi.ResourceClaimSpec) error {
	logger := klog.FromContext(ctx)
	ns := pod.Namespace
	api := m.client.ResourceV1().ResourceClaimTemplates(ns)
	cur, err := m.templates.ResourceClaimTemplates(ns).Get(name)
	if apierrors.IsNotFound(err) {
		tmpl := &resourceapi.ResourceClaimTemplate{
			ObjectMeta: metav1.ObjectMeta{
				Name:        name,
				Namespace:   ns,
				Labels:      map[string]string{compat.LabelManaged: "true"},
				Annotations: map[string]string{AnnotationLastAdmitted: m.now().UTC().Format(time.RFC3339)},
			},
			Spec: resourceapi.ResourceClaimTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{compat.LabelManaged: "true"}},
				Spec:       spec,
			},
		}
		_, err = api.Create(ctx, tmpl, metav1.CreateOptions{FieldManager: fieldManager})
		switch {
		case err == nil:
			logger.V(2).Info("Created translated ResourceClaimTemplate", "pod", klog.KObj(pod), "template", klog.KRef(ns, name))
			return nil
		case apierrors.IsAlreadyExists(err):
			// Not in the cache yet: check the stored one.
			if cur, err = api.Get(ctx, name, metav1.GetOptions{}); err != nil {
				return fmt.Errorf("reading ResourceClaimTemplate %s/%s: %w", ns, name, err)
			}
		case apierrors.IsInvalid(err):
			// A forged spec the API server refuses: retrying cannot help.
			m.warn(pod, ReasonTemplateRefused, name, "creating ResourceClaimTemplate %s/%s: %v", ns, name, err)
			return nil
		default:
			// Over an object-count quota, throttled, ...: retried with
			// backoff; the pod says why meanwhile.
			m.warn(pod, ReasonTemplateRefused, name, "creating ResourceClaimTemplate %s/%s (retrying): %v", ns, name, err)
			return fmt.Errorf("creating ResourceClaimTemplate %s/%s: %w", ns, name, err)
		}
	} else if err != nil {
		return fmt.Errorf("reading ResourceClaimTemplate %s/%s from cache: %w", ns, name, err)
	}
	if err := compat.CheckTemplateName(name, cur.Spec.Spec); err != nil {
		m.warn(pod, ReasonTemplateConflict, name,
			"ResourceClaimTemplate %s/%s was not made by gpulink's translation: %v; gpulink does not use it and will not allocate the claim made from it. Delete the template (kubectl delete resourceclaimtemplate -n %s %s) and re-create the pod",
			ns, name, err, ns, name)
		return nil
	}
	if cur.Labels[compat.LabelManaged] != "true" {
		// A user's template with exactly the translation's spec: used as
		// it is, and neither stamped nor collected (not gpulink's).
		return nil
	}
	return m.refresh(ctx, cur)
}

// refresh stamps the time of use on a template once a quarter of the
// grace has passed, with the resourceVersion read: a conflict (the
// collector deleted it, or another write) is retried through the queue.
func (m *TemplateMaker) refresh(ctx context.Context, cur *resourceapi.ResourceClaimTemplate) error {
	now := m.now().UTC()
	last, err := time.Parse(time.RFC3339, cur.Annotations[AnnotationLastAdmitted])
	if err == nil && now.Sub(last) < m.grace/4 {
		return nil
	}
	cur = cur.DeepCopy()
	if cur.Annotations == nil {
		cur.Annotations = map[string]string{}
	}
	cur.Annotations[AnnotationLastAdmitted] = now.Format(time.RFC3339)
	if _, err := m.client.ResourceV1().ResourceClaimTemplates(cur.Namespace).Update(ctx, cur, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
		return fmt.Errorf("refreshing the use time of ResourceClaimTemplate %s/%s: %w", cur.Namespace, cur.Name, err)
	}
	return nil
}

// warn records a Warning on the pod once per pod, reason and subject.
func (m *TemplateMaker) warn(pod *corev1.Pod, reason, subject, format string, args ...any) {
	key := reason + "/" + subject
	m.mu.Lock()
	if m.warned[pod.UID] == nil {
		m.warned[pod.UID] = map[string]bool{}
	}
	done := m.warned[pod.UID][key]
	m.warned[pod.UID][key] = true
	m.mu.Unlock()
	if done || m.rec == nil {
		return
	}
	m.rec.Eventf(pod, nil, corev1.EventTypeWarning, reason, actionCreateTemplate, "%s", truncateNote(fmt.Sprintf(format, args...)))
}

// truncateNote keeps an event note within the 1 kB events/v1 allows.
func truncateNote(s string) string {
	const limit = 1000
	if len(s) > limit {
		s = s[:limit-3] + "..."
	}
	return s
}
