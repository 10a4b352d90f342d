package kubeletplugin

import (
	"fmt"
	"strconv"

	cdispec "tags.cncf.io/container-device-interface/specs-go"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
)

// Task priority (GpuConfig sharing.priority, HAMi's nvidia.com/priority).
//
// The priority is a property of the processes in a container, not of a
// GPU: MPS reads CUDA_MPS_CLIENT_PRIORITY once per client process and
// HAMi-core reads CUDA_TASK_PRIORITY once per process. So a claim has one
// priority for all its shares (checkClaimPriority), and it goes into the
// claim device's edits, which every container using the claim gets.
//
// What it orders: under MPS, the clients of one MPS server. Under
// sharing.mpsMode Isolated every MPS claim has a server of its own
// (doc.go, "MPS daemons"), so the priority orders the claim's own
// processes among themselves; it cannot order this claim against another
// claim on the same GPU, whose server the GPU time-slices with this one.
// Under Concurrent the claims of one namespace on a GPU share its server,
// so it orders the clients of all of them. The controller says which in
// an event on the pod (controller/priority.go). Under HAMi-core the
// library itself decides what the variable means. Neither has been
// observed on a GPU here.

// Environment variables the priority is passed in.
const (
	// envMPSClientPriority is the MPS client priority (NVIDIA's MPS
	// documentation, section 4.2.8): 0 normal, 1 below normal, the same
	// numbers as HAMi's 0 high and 1 low.
	envMPSClientPriority = "CUDA_MPS_CLIENT_PRIORITY"
	// envHAMiTaskPriority is HAMi-core's priority, as HAMi's device
	// plugin sets it from nvidia.com/priority.
	envHAMiTaskPriority = "CUDA_TASK_PRIORITY"
	// envSharePriority records the priority for the workload, like
	// GPULINK_SHARE_MEMORY_<n>, whatever enforces it.
	envSharePriority = "GPULINK_SHARE_PRIORITY"
)

// checkClaimPriority refuses a claim whose shares ask different task
// priorities (a request with a priority beside one without counts as
// different): one container gets one value of a variable, whichever
// request it names, so one of them would silently not get what it asked.
func checkClaimPriority(pc *PreparedClaim, resultIdx []int) error {
	first := -1
	for j, dev := range pc.Devices {
		if dev.Share == nil {
			continue
		}
		if first < 0 {
			first = j
			continue
		}
		if a, b := pc.Devices[first].Share.Priority, dev.Share.Priority; !samePriority(a, b) {
			return fmt.Errorf("%s: sharing.priority %s, but %s asks %s; a container's processes have one task priority, so ask the same for every share of the claim (or use a claim per priority)",
				resultField(resultIdx[j]), priorityString(b), resultField(resultIdx[first]), priorityString(a))
		}
	}
	return nil
}

func samePriority(a, b *int) bool {
	if a == nil || b == nil {
		return a == b
	}
	return *a == *b
}

func priorityString(p *int) string {
	if p == nil {
		return "unset"
	}
	return strconv.Itoa(*p)
}

// claimPriority is the task priority of the claim's shares (one for all:
// checkClaimPriority), and the strategies that enforce them; nil when no
// share sets one.
func claimPriority(pc *PreparedClaim) (*int, map[apiv1alpha1.SharingStrategy]bool) {
	var prio *int
	strategies := map[apiv1alpha1.SharingStrategy]bool{}
	for _, dev := range pc.Devices {
		if dev.Share == nil || dev.Share.Priority == nil {
			continue
		}
		prio = dev.Share.Priority
		strategies[dev.Share.Strategy] = true
	}
	return prio, strategies
}

// addPriorityEdits puts the claim's task priority into the claim device's
// edits: the variable of each strategy its shares use, and
// GPULINK_SHARE_PRIORITY. Whole GPUs get nothing: a GPU no one else uses
// needs no order. A variable of a mechanism a container does not use is
// read by nothing, so a claim mixing strategies gives both.
func addPriorityEdits(edits *cdispec.ContainerEdits, pc *PreparedClaim) {
	prio, strategies := claimPriority(pc)
	if prio == nil {
		return
	}
	v := strconv.Itoa(*prio)
	if strategies[apiv1alpha1.SharingMPS] {
		edits.Env = append(edits.Env, envMPSClientPriority+"="+v)
	}
	if strategies[apiv1alpha1.SharingHAMiCore] {
		edits.Env = append(edits.Env, envHAMiTaskPriority+"="+v)
	}
	edits.Env = append(edits.Env, envSharePriority+"="+v)
}
