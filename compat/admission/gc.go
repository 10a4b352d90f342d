package admission

import (
	"context"
	"errors"
	"fmt"
	"time"

	resourceapi "k8s.io/api/resource/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/compat"
)

// Collector deletes the translation's templates once no pod references
// them and the last pod using them was seen longer than Grace ago. The
// claims created from a template are owned by their pods, so nothing the
// translation created outlives the pods.
//
// Only templates the translation could have made are deleted: labelled
// compat.LabelManaged=true (a label anyone may set) and named by the hash
// of their stored spec (compat.CheckTemplateName). A user's own template
// that merely carries the label is left alone.
type Collector struct {
	Client kubernetes.Interface
	Grace  time.Duration
	Now    func() time.Time
}

// Run collects every period until ctx ends.
func (c *Collector) Run(ctx context.Context, period time.Duration) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if n, err := c.Collect(ctx); err != nil {
			klog.FromContext(ctx).Error(err, "Collecting unused ResourceClaimTemplates", "deleted", n)
		} else if n > 0 {
			klog.FromContext(ctx).V(2).Info("Collected unused ResourceClaimTemplates", "deleted", n)
		}
	}, period)
}

// Collect makes one pass and returns how many templates it deleted.
func (c *Collector) Collect(ctx context.Context) (int, error) {
	now := time.Now()
	if c.Now != nil {
		now = c.Now()
	}
	list, err := c.Client.ResourceV1().ResourceClaimTemplates(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: compat.LabelManaged + "=true"})
	if err != nil {
		return 0, fmt.Errorf("listing templates: %w", err)
	}
	byNS := map[string][]resourceapi.ResourceClaimTemplate{}
	for _, t := range list.Items {
		if !compat.IsTemplateName(t.Name) {
			continue
		}
		if err := compat.CheckTemplateName(t.Name, t.Spec.Spec); err != nil {
			klog.FromContext(ctx).V(2).Info("Not collecting a labelled template gpulink did not make", "template", klog.KObj(&t), "reason", err.Error())
			continue
		}
		if expired(&t, now, c.Grace) {
			byNS[t.Namespace] = append(byNS[t.Namespace], t)
		}
	}
	deleted := 0
	var errs []error
	for ns, tmpls := range byNS {
		// Pods are read after the templates: a pod admitted after the
		// template list was taken refreshed its template's admission time,
		// which the delete's resourceVersion precondition then catches.
		pods, err := c.Client.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			errs = append(errs, fmt.Errorf("listing pods in %s: %w", ns, err))
			continue
		}
		used := map[string]bool{}
		for _, p := range pods.Items {
			for _, rc := range p.Spec.ResourceClaims {
				if rc.ResourceClaimTemplateName != nil {
					used[*rc.ResourceClaimTemplateName] = true
				}
			}
		}
		for _, t := range tmpls {
			if used[t.Name] {
				continue
			}
			err := c.Client.ResourceV1().ResourceClaimTemplates(ns).Delete(ctx, t.Name, metav1.DeleteOptions{
				Preconditions: &metav1.Preconditions{UID: &t.UID, ResourceVersion: &t.ResourceVersion},
			})
			switch {
			case err == nil:
				deleted++
			case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			default:
				errs = append(errs, fmt.Errorf("deleting template %s/%s: %w", ns, t.Name, err))
			}
		}
	}
	return deleted, errors.Join(errs...)
}

func expired(t *resourceapi.ResourceClaimTemplate, now time.Time, grace time.Duration) bool {
	last := t.CreationTimestamp.Time
	if v, err := time.Parse(time.RFC3339, t.Annotations[AnnotationLastAdmitted]); err == nil && v.After(last) {
		last = v
	}
	return now.Sub(last) >= grace
}
