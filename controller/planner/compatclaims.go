package planner

import (
	"fmt"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"

	"github.com/gpulink/gpulink/compat"
)

// CheckCompatClaim refuses a claim the resourceclaim controller made from
// a template under a translated name (compat.TemplatePrefix) whose spec
// does not hash to that name. Translated template names are predictable,
// so a namespace user can create one first with any spec; every later pod
// of that shape in the namespace, whoever creates it, would then get the
// squatter's claim. The claim's spec is the template's, copied unchanged
// and immutable (as is the template's), so checking the claim checks the
// template it came from. Allocated claims are not checked: someone else
// already allocated them, and there is nothing left to refuse.
func CheckCompatClaim(podClaim *corev1.PodResourceClaim, claim *resourceapi.ResourceClaim) error {
	if podClaim.ResourceClaimTemplateName == nil || claim.Status.Allocation != nil {
		return nil
	}
	tmpl := *podClaim.ResourceClaimTemplateName
	if !compat.IsTemplateName(tmpl) {
		return nil
	}
	if err := compat.CheckTemplateName(tmpl, claim.Spec); err != nil {
		return fmt.Errorf("claim %s/%s (pod claim %q) was made from ResourceClaimTemplate %s, which gpulink's translation did not make: %w; gpulink does not allocate it. Delete the template (kubectl delete resourceclaimtemplate -n %s %s) and re-create the pod",
			claim.Namespace, claim.Name, podClaim.Name, tmpl, err, claim.Namespace, tmpl)
	}
	return nil
}
