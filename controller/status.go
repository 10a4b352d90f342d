package controller

import (
	"context"
	"fmt"
	"slices"

	"github.com/google/uuid"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/gpulink/gpulink/controller/planner"
	"github.com/gpulink/gpulink/driver"
)

// buildAllocation turns the placed results of one claim into the claim's
// status.allocation and the device usage it represents.
//
// Whole GPUs are written as dedicated results (no shareID, no
// consumedCapacity) even on devices that allow multiple allocations:
// kube-scheduler's allocator counts a result without shareID as the whole
// device in use, for every other claim. Shares carry a fresh shareID and
// the consumedCapacity of every capacity the device publishes, rounded as
// the device's requestPolicy says, which is how kube-scheduler records and
// counts them. Other drivers' devices (foreign) are dedicated results of
// their driver; the kubelet prepares them with that driver's plugin.
func buildAllocation(ic *planner.Claim, n *planner.NodeInventory, placed []planner.PlacedResult, foreign []planner.ForeignResult, now metav1.Time) (*resourceapi.AllocationResult, []planner.DeviceUse) {
	alloc := &resourceapi.AllocationResult{
		NodeSelector:        planner.NodeSelectorFor(n.Node),
		AllocationTimestamp: &now,
	}
	var uses []planner.DeviceUse
	classRequests := map[string][]string{}
	var classOrder []*resourceapi.DeviceClass
	for _, r := range placed {
		for _, pos := range r.Positions {
			d := n.Devices[pos]
			res := resourceapi.DeviceRequestAllocationResult{
				Request:     r.Alt.ResultName,
				Driver:      driver.Name,
				Pool:        n.Pool,
				Device:      d.Name,
				Tolerations: slices.Clone(r.Alt.Tolerations),
			}
			use := planner.DeviceUse{Key: planner.DeviceKey{Pool: n.Pool, Device: d.Name}, Exclusive: r.Share == nil}
			if r.Share != nil {
				id := types.UID(uuid.NewString())
				res.ShareID = &id
				res.ConsumedCapacity = map[resourceapi.QualifiedName]resource.Quantity{}
				for k, v := range r.Consumed {
					res.ConsumedCapacity[k] = v.DeepCopy()
				}
				use.MemoryBytes = r.Share.MemoryBytes
				use.Cores = r.Share.Cores
				use.Group = r.Share.Group
			}
			alloc.Devices.Results = append(alloc.Devices.Results, res)
			uses = append(uses, use)
		}
		// MIG devices are always dedicated results: each is one claim's.
		for _, m := range r.MIG {
			alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
				Request:     r.Alt.ResultName,
				Driver:      driver.Name,
				Pool:        n.Pool,
				Device:      m.Name,
				Tolerations: slices.Clone(r.Alt.Tolerations),
			})
			uses = append(uses, planner.DeviceUse{Key: planner.DeviceKey{Pool: n.Pool, Device: m.Name}, Exclusive: true})
		}
		cls := r.Alt.Class
		if _, seen := classRequests[cls.Name]; !seen {
			classOrder = append(classOrder, cls)
		}
		if !slices.Contains(classRequests[cls.Name], r.Alt.ResultName) {
			classRequests[cls.Name] = append(classRequests[cls.Name], r.Alt.ResultName)
		}
	}
	for _, fr := range foreign {
		for _, d := range fr.Devices {
			alloc.Devices.Results = append(alloc.Devices.Results, resourceapi.DeviceRequestAllocationResult{
				Request:     fr.Req.ResultName,
				Driver:      d.Driver,
				Pool:        d.Pool,
				Device:      d.Name,
				Tolerations: slices.Clone(fr.Req.Tolerations),
			})
			uses = append(uses, planner.DeviceUse{Key: d.Key(), Exclusive: true})
		}
		cls := fr.Req.Class
		if _, seen := classRequests[cls.Name]; !seen {
			classOrder = append(classOrder, cls)
		}
		if !slices.Contains(classRequests[cls.Name], fr.Req.ResultName) {
			classRequests[cls.Name] = append(classRequests[cls.Name], fr.Req.ResultName)
		}
	}
	// Configuration as kube-scheduler copies it: the classes' first, then
	// the claim's, so the kubelet plugin layers them in that order.
	for _, cls := range classOrder {
		for _, c := range cls.Spec.Config {
			alloc.Devices.Config = append(alloc.Devices.Config, resourceapi.DeviceAllocationConfiguration{
				Source:              resourceapi.AllocationConfigSourceClass,
				Requests:            slices.Clone(classRequests[cls.Name]),
				DeviceConfiguration: *c.DeviceConfiguration.DeepCopy(),
			})
		}
	}
	for _, c := range ic.Claim.Spec.Devices.Config {
		alloc.Devices.Config = append(alloc.Devices.Config, resourceapi.DeviceAllocationConfiguration{
			Source:              resourceapi.AllocationConfigSourceClaim,
			Requests:            slices.Clone(c.Requests),
			DeviceConfiguration: *c.DeviceConfiguration.DeepCopy(),
		})
	}
	return alloc, uses
}

func hasFinalizer(obj metav1.Object) bool {
	return slices.Contains(obj.GetFinalizers(), driver.ClaimFinalizer)
}

// writeAllocation adds the finalizer (a metadata update) unless the claim
// carries it already (the chart's admission policy adds it at creation),
// and in the same update the container group (containerClaimGroups) when
// it has one, then writes the allocation, and the reservation for
// consumer when there is one (a bound pod's, see writeDecision), in one
// status update. Both writes carry the resourceVersion read before, so a
// claim changed by anyone in between is never overwritten: the update
// conflicts and the pod is retried with fresh data.
func (c *Controller) writeAllocation(ctx context.Context, claim *resourceapi.ResourceClaim, alloc *resourceapi.AllocationResult, consumer *resourceapi.ResourceClaimConsumerReference, group string) (*resourceapi.ResourceClaim, error) {
	cur := claim
	if !hasFinalizer(cur) || (group != "" && cur.Annotations[driver.ContainerClaimsAnnotation] != group) {
		upd := cur.DeepCopy()
		if !hasFinalizer(upd) {
			upd.Finalizers = append(upd.Finalizers, driver.ClaimFinalizer)
		}
		if group != "" {
			if upd.Annotations == nil {
				upd.Annotations = map[string]string{}
			}
			upd.Annotations[driver.ContainerClaimsAnnotation] = group
		}
		var err error
		cur, err = c.client.ResourceV1().ResourceClaims(upd.Namespace).Update(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager})
		if err != nil {
			return nil, fmt.Errorf("adding finalizer %s and annotation %s=%q to claim %s/%s: %w", driver.ClaimFinalizer, driver.ContainerClaimsAnnotation, group, claim.Namespace, claim.Name, err)
		}
	}
	upd := cur.DeepCopy()
	upd.Status.Allocation = alloc
	if consumer != nil && !slices.ContainsFunc(upd.Status.ReservedFor, func(r resourceapi.ResourceClaimConsumerReference) bool { return r.UID == consumer.UID }) {
		upd.Status.ReservedFor = append(upd.Status.ReservedFor, *consumer)
	}
	out, err := c.client.ResourceV1().ResourceClaims(upd.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("writing allocation of claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return out, nil
}

// releaseClaim removes a claim's reservations and then its allocation
// (the API allows removing an allocation only while reservedFor is empty),
// then the finalizer. A claim being deleted only loses the finalizer once
// its reservations are gone.
func (c *Controller) releaseClaim(ctx context.Context, claim *resourceapi.ResourceClaim, keep []resourceapi.ResourceClaimConsumerReference) (*resourceapi.ResourceClaim, error) {
	claims := c.client.ResourceV1().ResourceClaims(claim.Namespace)
	cur, err := c.keepReservations(ctx, claim, keep)
	if err != nil || len(keep) > 0 {
		return cur, err
	}
	if cur.Status.Allocation != nil && cur.DeletionTimestamp == nil {
		upd := cur.DeepCopy()
		upd.Status.Allocation = nil
		c.markReleasing(claim.UID, true)
		// Before the write: once it lands, a decision may allocate the
		// claim again.
		c.settleIfHandedOver(claim)
		if cur, err = claims.UpdateStatus(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			// A write that failed without an answer may still land; then
			// onDeallocated takes it for someone else's, which costs the
			// pods using the claim the node at worst.
			c.markReleasing(claim.UID, false)
			return nil, fmt.Errorf("removing allocation from claim %s/%s: %w", claim.Namespace, claim.Name, err)
		}
		c.claimVersions.saw(cur)
	}
	if hasFinalizer(cur) {
		upd := cur.DeepCopy()
		upd.Finalizers = slices.DeleteFunc(upd.Finalizers, func(f string) bool { return f == driver.ClaimFinalizer })
		if cur, err = claims.Update(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager}); err != nil {
			return nil, fmt.Errorf("removing finalizer %s from claim %s/%s: %w", driver.ClaimFinalizer, claim.Namespace, claim.Name, err)
		}
		c.claimVersions.saw(cur)
	}
	return cur, nil
}

// keepReservations reduces a claim's reservations to keep (one status
// update carrying the resourceVersion read, none when nothing changes).
func (c *Controller) keepReservations(ctx context.Context, claim *resourceapi.ResourceClaim, keep []resourceapi.ResourceClaimConsumerReference) (*resourceapi.ResourceClaim, error) {
	if len(claim.Status.ReservedFor) == len(keep) {
		return claim, nil
	}
	upd := claim.DeepCopy()
	upd.Status.ReservedFor = keep
	cur, err := c.client.ResourceV1().ResourceClaims(claim.Namespace).UpdateStatus(ctx, upd, metav1.UpdateOptions{FieldManager: fieldManager})
	if err != nil {
		return nil, fmt.Errorf("removing reservations from claim %s/%s: %w", claim.Namespace, claim.Name, err)
	}
	return cur, nil
}
