package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"

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

// maxBody bounds an AdmissionReview; pods are far smaller.
const maxBody = 8 << 20

// TemplateStore makes sure a translated pod's templates exist.
type TemplateStore interface {
	Ensure(ctx context.Context, namespace, name string, spec resourceapi.ResourceClaimTemplateSpec) error
}

// Webhook is the mutating admission webhook that translates pods.
type Webhook struct {
	Translator *compat.Translator
	Templates  TemplateStore
	Metrics    *Metrics
}

// ServeHTTP answers one AdmissionReview (admission.k8s.io/v1).
func (w *Webhook) ServeHTTP(rw http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(rw, "POST an AdmissionReview", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		http.Error(rw, "reading the AdmissionReview failed or it is too large", http.StatusBadRequest)
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
		return allow
	}
	// Templates first: a pod must never exist whose template does not.
	// A dry run creates nothing (sideEffects NoneOnDryRun).
	if req.DryRun == nil || !*req.DryRun {
		for name, spec := range res.Templates {
			if err := w.Templates.Ensure(ctx, pod.Namespace, name, spec); err != nil {
				w.Metrics.count("error")
				return deny(http.StatusInternalServerError, fmt.Sprintf("creating ResourceClaimTemplate %s/%s for the pod's GPU resources: %v", pod.Namespace, name, err))
			}
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

func podName(p *corev1.Pod) string {
	if p.Name != "" {
		return p.Name
	}
	return p.GenerateName + "*"
}

func deny(code int32, msg string) *admissionv1.AdmissionResponse {
	reason := metav1.StatusReasonInvalid
	if code >= 500 {
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
