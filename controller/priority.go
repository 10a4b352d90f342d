package controller

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/controller/report"
)

// maxPriorityGPUs bounds the GPUs one note names.
const maxPriorityGPUs = 3

// explainPriority records, after an allocation, what the task priorities
// of the pod's MPS shares can and cannot order (priorityScope).
func (c *Controller) explainPriority(pod *corev1.Pod, chosen *planner.Plan, claims []*planner.Claim) {
	note, crowded := priorityScope(chosen, claims)
	if note == "" {
		return
	}
	eventType := corev1.EventTypeNormal
	if crowded {
		eventType = corev1.EventTypeWarning
	}
	c.explain.event(pod, claims[0].Claim, eventType, report.ReasonPriorityScope, actionAllocate, note)
}

// priorityScope says, for each of the planned claims with an MPS share
// that sets sharing.priority, that the priority (the client's
// CUDA_MPS_CLIENT_PRIORITY, set by the kubelet plugin) orders only the
// clients of one MPS server, and every MPS claim gets a server of its own:
// it orders the claim's own processes among themselves, never this claim
// against another claim's shares on the same GPU, whose servers the GPU
// time-slices with it. crowded is true when some such GPU already carries
// shares of other claims (or of the pod's other claims in this plan), so
// the priority is known not to do what HAMi users expect from it. Nothing
// is said about HAMi-core shares: what HAMi-core does with its priority
// variable is up to the library, not to a per-claim server.
func priorityScope(pl *planner.Plan, claims []*planner.Claim) (note string, crowded bool) {
	if pl == nil {
		return "", false
	}
	// Shares each planned claim puts on each GPU position.
	planned := make([]map[int]int, len(pl.Claims))
	for i, results := range pl.Claims {
		planned[i] = map[int]int{}
		for _, r := range results {
			if r.Share == nil {
				continue
			}
			for _, pos := range r.Positions {
				planned[i][pos]++
			}
		}
	}
	// othersOn counts the shares on GPU pos that are not claim i's: held
	// already, or planned for the pod's other claims.
	othersOn := func(i, pos int) int {
		others := 0
		if pos < len(pl.Base) {
			others = pl.Base[pos].Shares
		}
		for j := range planned {
			if j != i {
				others += planned[j][pos]
			}
		}
		return others
	}
	var notes []string
	for i, results := range pl.Claims {
		if i >= len(claims) {
			break
		}
		prio, gpus, concurrent := (*int)(nil), map[int]bool{}, false
		var order []int
		for _, r := range results {
			if r.Share == nil || r.Alt == nil || r.Alt.Config == nil || r.Alt.Config.Sharing == nil {
				continue
			}
			s := r.Alt.Config.Sharing
			if s.Strategy != v1alpha1.SharingMPS || s.Priority == nil {
				continue
			}
			prio = s.Priority
			concurrent = concurrent || r.Alt.ShareGroup != ""
			for _, pos := range r.Positions {
				if !gpus[pos] {
					gpus[pos] = true
					order = append(order, pos)
				}
			}
		}
		if prio == nil {
			continue
		}
		var busy []string
		for _, pos := range order {
			others := othersOn(i, pos)
			if others == 0 {
				continue
			}
			if len(busy) == maxPriorityGPUs {
				busy = append(busy, "more")
				break
			}
			unit := "share"
			if others > 1 {
				unit = "shares"
			}
			busy = append(busy, fmt.Sprintf("%s (%d %s)", deviceName(pl, pos), others, unit))
		}
		if concurrent {
			// One server serves the namespace's concurrent shares of
			// the GPU, and no other share may join it: the priority
			// orders them all.
			var where []string
			for _, pos := range order {
				where = append(where, fmt.Sprintf("%s (%d other shares there now)", deviceName(pl, pos), othersOn(i, pos)))
			}
			notes = append(notes, fmt.Sprintf("claim %s: sharing.priority %d (CUDA_MPS_CLIENT_PRIORITY=%d) orders the clients of namespace %s's MPS server on %s (sharing.mpsMode=%s): this claim's processes and those of the namespace's other concurrent shares of that GPU",
				claims[i].Claim.Name, *prio, *prio, claims[i].Claim.Namespace, strings.Join(where, ", "), v1alpha1.MPSConcurrent))
			continue
		}
		head := fmt.Sprintf("claim %s: sharing.priority %d (CUDA_MPS_CLIENT_PRIORITY=%d) orders only the clients of the claim's own MPS server, its own processes", claims[i].Claim.Name, *prio, *prio)
		if len(busy) == 0 {
			notes = append(notes, head+"; shares of other claims that come to its GPU later run under MPS servers of their own, which the GPU time-slices with it, and are not ordered against it")
			continue
		}
		crowded = true
		notes = append(notes, head+fmt.Sprintf("; it cannot be ordered against the shares of other claims already on %s, each under an MPS server of its own, time-sliced with this one by the GPU", strings.Join(busy, ", ")))
	}
	if len(notes) == 0 {
		return "", false
	}
	note = strings.Join(notes, "; ") + ` (README, "What MPS guarantees")`
	if len(note) > planner.MaxEventNote {
		note = note[:planner.MaxEventNote-3] + "..."
	}
	return note, crowded
}

// deviceName names a GPU position of the plan's node.
func deviceName(pl *planner.Plan, pos int) string {
	if pl.Node != nil && pos < len(pl.Node.Devices) && pl.Node.Devices[pos] != nil {
		return pl.Node.Devices[pos].Name
	}
	return fmt.Sprintf("GPU position %d", pos)
}
