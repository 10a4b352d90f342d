package kubeletplugin

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
)

// PodGetter reads one pod; the plugin uses it to look at the containers
// of the pods a claim is reserved for.
type PodGetter func(ctx context.Context, namespace, name string) (*corev1.Pod, error)

// PodGetterFor reads pods through the API.
func PodGetterFor(c corev1client.PodsGetter) PodGetter {
	return func(ctx context.Context, namespace, name string) (*corev1.Pod, error) {
		return c.Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	}
}

// checkMPSUsers refuses an MPS claim whose containers are set to run as
// different users. MPS starts one server per user ID and makes a second
// user's clients wait until every client of the first user is gone, so
// such containers would hang rather than share the GPU. Only users set in
// the pod spec (securityContext.runAsUser) can be seen here; a user that
// comes from the image's USER line is not, which the README says.
func (d *Driver) checkMPSUsers(ctx context.Context, claim *resourceapi.ResourceClaim, pc *PreparedClaim) error {
	if d.pods == nil || !pc.hasMPS() {
		return nil
	}
	users := map[int64][]string{}
	for _, ref := range claim.Status.ReservedFor {
		if ref.APIGroup != "" || ref.Resource != "pods" {
			continue
		}
		pod, err := d.pods(ctx, claim.Namespace, ref.Name)
		if err != nil {
			return fmt.Errorf("status.reservedFor: reading pod %s/%s to check the users of the MPS share: %w", claim.Namespace, ref.Name, err)
		}
		if pod.UID != ref.UID {
			continue // replaced by a pod of the same name
		}
		for _, c := range containersUsing(pod, claim.Name) {
			if uid := runAsUser(pod, c); uid != nil {
				users[*uid] = append(users[*uid], pod.Name+"/"+c.Name)
			}
		}
	}
	if len(users) < 2 {
		return nil
	}
	ids := make([]int64, 0, len(users))
	for id := range users {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("user %s (%s)", strconv.FormatInt(id, 10), strings.Join(users[id], ", "))
	}
	return fmt.Errorf("the containers sharing this claim's MPS share run as %s; MPS serves one user at a time and makes the others wait, so run them all as one user (securityContext.runAsUser)", strings.Join(parts, " and "))
}

// hasMPS says whether the claim has an MPS share.
func (pc *PreparedClaim) hasMPS() bool {
	for _, dev := range pc.Devices {
		if dev.Share != nil && dev.Share.Strategy == apiv1alpha1.SharingMPS {
			return true
		}
	}
	return false
}

// containersUsing lists the pod's containers (init containers included)
// that use the claim named claimName.
func containersUsing(pod *corev1.Pod, claimName string) []*corev1.Container {
	names := map[string]bool{}
	for i := range pod.Spec.ResourceClaims {
		if n, _, err := resourceclaim.Name(pod, &pod.Spec.ResourceClaims[i]); err == nil && n != nil && *n == claimName {
			names[pod.Spec.ResourceClaims[i].Name] = true
		}
	}
	var out []*corev1.Container
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if slices.ContainsFunc(list[i].Resources.Claims, func(c corev1.ResourceClaim) bool { return names[c.Name] }) {
				out = append(out, &list[i])
			}
		}
	}
	return out
}

// runAsUser is the user the container is set to run as, nil when the pod
// spec does not say.
func runAsUser(pod *corev1.Pod, c *corev1.Container) *int64 {
	if c.SecurityContext != nil && c.SecurityContext.RunAsUser != nil {
		return c.SecurityContext.RunAsUser
	}
	if pod.Spec.SecurityContext != nil {
		return pod.Spec.SecurityContext.RunAsUser
	}
	return nil
}
