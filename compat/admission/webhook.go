package admission

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/compat"
)

// Path is where the webhook is served.
const Path = "/translate-pods"

// QuotaChecker refuses translations in namespaces whose ResourceQuota
// would not hold for the translated pod (QuotaGuard).
type QuotaChecker interface {
	Check(namespace string, specs []resourceapi.ResourceClaimSpec) error
}

// Webhook is the mutating admission webhook that translates pods. It has
// no side effects: anyone who reaches its port can call it (the API server
// does not authenticate itself to webhooks unless configured to), so it
// only answers with a patch. The templates a translated pod needs travel
// in its annotation compat.AnnotationTemplates; the controller's leader
// creates them once the pod exists (TemplateMaker).
type Webhook struct {
	Translator *compat.Translator
	// Quota, when set, refuses translations that a namespace's
	// ResourceQuota on the device-plugin names would not count.
	Quota   QuotaChecker
	Metrics *Metrics
	// MaxBodyBytes bounds the review read; 0: DefaultLimits.MaxBodyBytes.
	// ServeTLS's limits refuse larger ones before reading them.
	MaxBodyBytes int64
}

// ServeHTTP answers one AdmissionReview (admission.k8s.io/v1).
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := readBody(r, cmp.Or(w.MaxBodyBytes, DefaultLimits.MaxBodyBytes))
	if err != nil {
		http.Error(rw, err.Error(), http.StatusBadRequest)
		return
	}
	var review admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &review); err != nil || review.Request == nil {
		http.Error(rw, fmt.Sprintf("not an AdmissionReview: %v", err), http.StatusBadRequest)
		return
	}
	resp := w.review(r.Context(), review.Request)
	resp.UID = review.Request.UID
	out := admissionv1.AdmissionReview{TypeMeta: review.TypeMeta, Response: resp}
	if out.APIVersion == "" {
		out.APIVersion, out.Kind = "admission.k8s.io/v1", "AdmissionReview"
	}
	rw.Header().Set("Content-Type", "application/json")
	if err := json.NewEncoder(rw).Encode(out); err != nil {
		klog.FromContext(r.Context()).Error(err, "Writing admission response")
	}
}

// readBody reads at most limit bytes of the request's body, into a buffer
// of its Content-Length when it has one (io.ReadAll's doubling would hold
// up to twice the body).
func readBody(r *http.Request, limit int64) ([]byte, error) {
	if r.ContentLength > limit {
		return nil, fmt.Errorf("the AdmissionReview's Content-Length %d exceeds %d bytes", r.ContentLength, limit)
	}
	if r.ContentLength >= 0 {
		body := make([]byte, r.ContentLength)
		if _, err := io.ReadFull(r.Body, body); err != nil {
			return nil, fmt.Errorf("reading the AdmissionReview (%d bytes): %w", r.ContentLength, err)
		}
		return body, nil
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("reading the AdmissionReview: %w", err)
	}
	if int64(len(body)) > limit {
		return nil, fmt.Errorf("the AdmissionReview exceeds %d bytes", limit)
	}
	return body, nil
}

func (w *Webhook) review(ctx context.Context, req *admissionv1.AdmissionRequest) *admissionv1.AdmissionResponse {
	allow := &admissionv1.AdmissionResponse{Allowed: true}
	if req.Kind.Kind != "Pod" || req.Operation != admissionv1.Create || req.SubResource != "" {
		return allow
	}
	var pod corev1.Pod
	if err := json.Unmarshal(req.Object.Raw, &pod); err != nil {
		return deny(http.StatusBadRequest, fmt.Sprintf("decoding the pod: %v", err))
	}
	// Admission of a pod created with generateName has no name yet.
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	logger := klog.FromContext(ctx).WithValues("pod", klog.KRef(pod.Namespace, podName(&pod)))
	res, err := w.Translator.Translate(&pod)
	if err != nil {
		w.Metrics.count("refused")
		logger.V(2).Info("Refused pod", "err", err)
		return deny(http.StatusUnprocessableEntity, "gpulink cannot translate this pod's GPU resources: "+err.Error())
	}
	if res == nil {
		// The API server calls the webhook only for pods asking for a name
		// the chart translates (matchConditions). A running configuration
		// that translates none of them (a family turned on by helm upgrade
		// before this replica restarted) would admit the pod untranslated,
		// to wait forever for a resource no node has: refuse it instead.
		if names := extendedResourceNames(&pod); len(names) > 0 {
			w.Metrics.count("refused")
			logger.Info("Refused pod: the webhook was called for resources this controller's configuration does not translate", "resources", names)
			return deny(http.StatusServiceUnavailable, fmt.Sprintf(
				"gpulink's translation webhook was called for this pod's %s, but the running controller's configuration (--compat-config) translates none of them, "+
					"and admitted untranslated the pod would wait forever for a resource no node has. If compat.families changed in a helm upgrade, "+
					"the controller restarts with it (the chart rolls it on a change of the configuration): retry in a minute",
				strings.Join(names, ", ")))
		}
		return allow
	}
	if w.Quota != nil && len(res.Claims) > 0 {
		specs := make([]resourceapi.ResourceClaimSpec, 0, len(res.Templates))
		for _, spec := range res.Templates {
			specs = append(specs, spec.Spec)
		}
		if err := w.Quota.Check(pod.Namespace, specs); err != nil {
			if isQuotaError(err) {
				w.Metrics.count("refused")
				logger.V(2).Info("Refused pod: its namespace's quota would not count the translated GPUs", "err", err)
				return deny(http.StatusForbidden, "gpulink does not translate this pod's GPU resources: "+err.Error())
			}
			w.Metrics.count("error")
			return deny(http.StatusInternalServerError, err.Error())
		}
	}
	patch, err := jsonPatch(&pod, res.Pod)
	if err != nil {
		w.Metrics.count("error")
		return deny(http.StatusInternalServerError, err.Error())
	}
	w.Metrics.count("translated")
	if len(res.Claims) > 0 {
		logger.V(2).Info("Translated pod", "summary", res.Summary())
	}
	pt := admissionv1.PatchTypeJSONPatch
	return &admissionv1.AdmissionResponse{Allowed: true, Patch: patch, PatchType: &pt}
}

// extendedResourceNames lists the domain-qualified resource names the
// pod's containers ask for outside kubernetes.io (what device plugins
// serve), sorted.
func extendedResourceNames(pod *corev1.Pod) []string {
	seen := map[string]bool{}
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, l := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for n := range l {
					if name := string(n); strings.Contains(name, "/") && !strings.Contains(name, "kubernetes.io/") {
						seen[name] = true
					}
				}
			}
		}
	}
	return slices.Sorted(maps.Keys(seen))
}

func podName(p *corev1.Pod) string {
	if p.Name != "" {
		return p.Name
	}
	return p.GenerateName + "*"
}

func deny(code int32, msg string) *admissionv1.AdmissionResponse {
	reason := metav1.StatusReasonInvalid
	switch {
	case code == http.StatusForbidden:
		reason = metav1.StatusReasonForbidden
	case code >= 500:
		reason = metav1.StatusReasonInternalError
	}
	return &admissionv1.AdmissionResponse{Allowed: false, Result: &metav1.Status{Status: metav1.StatusFailure, Code: code, Reason: reason, Message: msg}}
}

type patchOp struct {
	Op    string `json:"op"`
	Path  string `json:"path"`
	Value any    `json:"value"`
}

// jsonPatch replaces what the translation changed. "add" replaces an
// existing member and creates a missing one, so it fits both.
func jsonPatch(before, after *corev1.Pod) ([]byte, error) {
	var ops []patchOp
	containers := func(kind string, b, a []corev1.Container) {
		for i := range a {
			if !equality.Semantic.DeepEqual(b[i].Resources, a[i].Resources) {
				ops = append(ops, patchOp{"add", "/spec/" + kind + "/" + strconv.Itoa(i) + "/resources", a[i].Resources})
			}
		}
	}
	containers("initContainers", before.Spec.InitContainers, after.Spec.InitContainers)
	containers("containers", before.Spec.Containers, after.Spec.Containers)
	if !equality.Semantic.DeepEqual(before.Spec.ResourceClaims, after.Spec.ResourceClaims) {
		ops = append(ops, patchOp{"add", "/spec/resourceClaims", after.Spec.ResourceClaims})
	}
	if !equality.Semantic.DeepEqual(before.Spec.SchedulingGates, after.Spec.SchedulingGates) {
		ops = append(ops, patchOp{"add", "/spec/schedulingGates", after.Spec.SchedulingGates})
	}
	if !equality.Semantic.DeepEqual(before.Labels, after.Labels) {
		ops = append(ops, patchOp{"add", "/metadata/labels", after.Labels})
	}
	if !equality.Semantic.DeepEqual(before.Annotations, after.Annotations) {
		ops = append(ops, patchOp{"add", "/metadata/annotations", after.Annotations})
	}
	if len(ops) == 0 {
		return nil, errors.New("translation changed nothing")
	}
	b, err := json.Marshal(ops)
	if err != nil {
		return nil, fmt.Errorf("encoding the pod patch: %w", err)
	}
	return b, nil
}
