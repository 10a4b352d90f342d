package admission

import (
	"context"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/compat"
)

// AnnotationLastAdmitted on a template is when a pod using it was last
// admitted. The garbage collector keeps a template for Grace after that,
// so a pod admitted but not yet stored (its template unreferenced for a
// moment) never loses its template.
const AnnotationLastAdmitted = "gpu.gpulink.dev/last-admitted"

// fieldManager names gpulink's compatibility layer in managedFields.
const fieldManager = "gpulink-compat"

// Templates creates the translation's ResourceClaimTemplates.
type Templates struct {
	Client kubernetes.Interface
	// Grace is how long a template outlives its last admitted pod when no
	// pod references it; the admission time is refreshed once a quarter of
	// it has passed, so busy templates are not rewritten for every pod.
	Grace time.Duration
	Now   func() time.Time
}

func (t *Templates) now() time.Time {
	if t.Now != nil {
		return t.Now()
	}
	return time.Now()
}

// Ensure creates the template, or refreshes the admission time of the
// existing one. Templates are named by their spec, so an existing one
// with that name asks for the same thing; one gpulink did not create is
// refused rather than used.
func (t *Templates) Ensure(ctx context.Context, namespace, name string, spec resourceapi.ResourceClaimTemplateSpec) error {
	now := t.now().UTC()
	api := t.Client.ResourceV1().ResourceClaimTemplates(namespace)
	tmpl := &resourceapi.ResourceClaimTemplate{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Namespace:   namespace,
			Labels:      map[string]string{compat.LabelManaged: "true"},
			Annotations: map[string]string{AnnotationLastAdmitted: now.Format(time.RFC3339)},
		},
		Spec: spec,
	}
	_, err := api.Create(ctx, tmpl, metav1.CreateOptions{FieldManager: fieldManager})
	if err == nil || !apierrors.IsAlreadyExists(err) {
		return err
	}
	for range 3 {
		cur, err := api.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			// Collected meanwhile: create it again.
			if _, err = api.Create(ctx, tmpl, metav1.CreateOptions{FieldManager: fieldManager}); err == nil || !apierrors.IsAlreadyExists(err) {
				return err
			}
			continue
		}
		if err != nil {
			return err
		}
		if cur.Labels[compat.LabelManaged] != "true" {
			return fmt.Errorf("a ResourceClaimTemplate %s exists that gpulink did not create (no label %s=true)", name, compat.LabelManaged)
		}
		last, perr := time.Parse(time.RFC3339, cur.Annotations[AnnotationLastAdmitted])
		if perr == nil && now.Sub(last) < t.Grace/4 {
			return nil
		}
		cur = cur.DeepCopy()
		if cur.Annotations == nil {
			cur.Annotations = map[string]string{}
		}
		cur.Annotations[AnnotationLastAdmitted] = now.Format(time.RFC3339)
		// The update carries the resourceVersion read: it fails if the
		// collector deleted the template meanwhile, and is retried.
		_, err = api.Update(ctx, cur, metav1.UpdateOptions{FieldManager: fieldManager})
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return fmt.Errorf("ResourceClaimTemplate %s kept changing while being refreshed", name)
}
