package controller

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/controller/planner"
)

// mpsUserConflict explains why the gated pod must not join its MPS
// claims, or returns "" when it may. MPS starts one server per user ID
// and makes a second user's clients wait until every client of the first
// is gone, so containers of different users on one claim would hang
// rather than share the GPU.
//
// The check lives here, not in the kubelet plugin, so that no GPU node
// needs to read pods: the controller already watches every pod, and the
// pods a claim is reserved for are read from its cache (a pod that is gone
// or finished no longer counts). Only users set in the pod spec
// (securityContext.runAsUser) can be seen; a user from the image's USER
// line cannot. A mismatch only ever hurts the namespace's own pods (a
// claim and its pods share one namespace), so this is a usability check,
// not a security boundary (docs/security.md).
func (c *Controller) mpsUserConflict(pod *corev1.Pod, ours []*planner.Claim) string {
	for _, ic := range ours {
		if !ic.UsesMPS() {
			continue
		}
		users := mpsUsers{}
		users.add(pod, ic.Claim.Name)
		for _, other := range c.otherLivePods(ic.Claim, pod) {
			users.add(other, ic.Claim.Name)
		}
		if len(users) < 2 {
			continue
		}
		return fmt.Sprintf("claim %s has an MPS share and the containers sharing it would run as %s; MPS serves one user at a time and makes the others wait, so run them all as one user (securityContext.runAsUser); the pod stays gated until then",
			ic.Claim.Name, users)
	}
	return ""
}

// mpsUsers are the containers using MPS shares by the user they run as.
type mpsUsers map[int64][]string

// add counts the pod's containers that use the claim and whose user the
// pod spec sets.
func (u mpsUsers) add(pod *corev1.Pod, claimName string) {
	for _, ctr := range containersUsing(pod, claimName) {
		if uid := runAsUser(pod, ctr); uid != nil && !slices.Contains(u[*uid], pod.Name+"/"+ctr.Name) {
			u[*uid] = append(u[*uid], pod.Name+"/"+ctr.Name)
		}
	}
}

// String names each user and their containers: "user 0 (b/main) and user
// 1000 (a/main, c/main)".
func (u mpsUsers) String() string {
	ids := slices.Sorted(maps.Keys(u))
	parts := make([]string, len(ids))
	for i, id := range ids {
		parts[i] = fmt.Sprintf("user %s (%s)", strconv.FormatInt(id, 10), strings.Join(slices.Sorted(slices.Values(u[id])), ", "))
	}
	return strings.Join(parts, " and ")
}

// otherLivePods are the pods besides pod that use the claim and still
// run: those it is reserved for, and those that reference it and are
// bound, ungated or decided by this controller (kube-scheduler reserves a
// claim for a pod only when it binds it, see writeDecision). A pod that is
// gone, replaced by a pod of the same name, or finished does not count.
func (c *Controller) otherLivePods(claim *resourceapi.ResourceClaim, pod *corev1.Pod) []*corev1.Pod {
	var out []*corev1.Pod
	for _, other := range c.claimPods(claim) {
		if other.UID == pod.UID || planner.PodDone(other) {
			continue
		}
		reserved := slices.ContainsFunc(claim.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == other.UID })
		if reserved || other.Spec.NodeName != "" || c.handedOver(other) || c.isDecided(other.UID) {
			out = append(out, other)
		}
	}
	return out
}

// setDecided records (or forgets) that this controller wrote or is
// writing the pod's decision.
func (c *Controller) setDecided(uid types.UID, decided bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if decided {
		c.decided.Insert(uid)
	} else {
		c.decided.Delete(uid)
	}
}

func (c *Controller) isDecided(uid types.UID) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.decided.Has(uid)
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

// concurrentDevices are the devices of the claims' concurrent MPS shares
// (sharing.mpsMode Concurrent) as allocated.
func concurrentDevices(claims []*planner.Claim) []planner.DeviceKey {
	var out []planner.DeviceKey
	for _, ic := range claims {
		for _, u := range planner.UsesOf(ic.Claim) {
			if u.Group != "" && !slices.Contains(out, u.Key) {
				out = append(out, u.Key)
			}
		}
	}
	return out
}

// plannedConcurrentDevices are the devices the plan puts the pending
// claims' concurrent MPS shares on.
func plannedConcurrentDevices(plan *planner.Plan) []planner.DeviceKey {
	var out []planner.DeviceKey
	for _, claim := range plan.Claims {
		for _, r := range claim {
			if r.Share == nil || r.Alt.ShareGroup == "" {
				continue
			}
			for _, pos := range r.Positions {
				k := planner.DeviceKey{Pool: plan.Node.Pool, Device: plan.Node.Devices[pos].Name}
				if !slices.Contains(out, k) {
					out = append(out, k)
				}
			}
		}
	}
	return out
}

// mpsGroupUserConflict explains why the pod must not join the concurrent
// MPS servers of devices (where its concurrent MPS shares are, or would
// be), or returns "" when it may. The concurrent MPS shares of a
// namespace on one GPU are clients of one MPS server, and MPS serves one
// user at a time: a pod running as another user than the live pods
// already using that GPU's server would wait until they finish. As in
// mpsUserConflict, only users set in pod specs are known.
func (c *Controller) mpsGroupUserConflict(pod *corev1.Pod, ours []*planner.Claim, devices []planner.DeviceKey) string {
	if len(devices) == 0 {
		return ""
	}
	users := mpsUsers{}
	own := map[types.UID]bool{}
	for _, ic := range ours {
		own[ic.Claim.UID] = true
		if ic.UsesConcurrentMPS() {
			users.add(pod, ic.Claim.Name)
		}
	}
	on := map[planner.DeviceKey]bool{}
	for _, d := range devices {
		on[d] = true
	}
	claims, err := c.claims.ResourceClaims(pod.Namespace).List(labels.Everything())
	if err != nil {
		return ""
	}
	for _, claim := range claims {
		if own[claim.UID] || claim.Status.Allocation == nil {
			continue
		}
		if !slices.ContainsFunc(planner.UsesOf(claim), func(u planner.DeviceUse) bool { return u.Group != "" && on[u.Key] }) {
			continue
		}
		for _, other := range c.otherLivePods(claim, pod) {
			users.add(other, claim.Name)
		}
	}
	if len(users) < 2 {
		return ""
	}
	names := make([]string, len(devices))
	for i, d := range devices {
		names[i] = d.Pool + "/" + d.Device
	}
	return fmt.Sprintf("the pod's MPS shares (sharing.mpsMode=%s) would be clients of the MPS server of namespace %s on %s, whose clients would run as %s; MPS serves one user at a time and makes the others wait, so run the namespace's pods on that GPU as one user (securityContext.runAsUser); the pod stays gated until then",
		v1alpha1.MPSConcurrent, pod.Namespace, strings.Join(names, ", "), users)
}
