package kubeletplugin

import (
	"fmt"

	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// checkConflicts is the last line of defense against double allocation:
// a GPU given whole must not be in any other prepared claim, shares of
// one GPU must fit into it together, in memory and in cores (as the
// controller counts them), and a GPU with Concurrent MPS shares carries
// only Concurrent MPS shares of one namespace (checkMPSGroups).
// Admin-access results are exempt. A refusal reaches the claim's tenant
// (the kubelet shows it in the pod's events), so it names no other claim;
// the log has the claim in the way (refuseBeside).
func (d *Driver) checkConflicts(logger klog.Logger, pc *PreparedClaim, resultIdx []int) error {
	type usage struct {
		wholeBy     *PreparedClaim
		mem, cores  int64
		shareClaims int
		mpsGroups
	}
	used := map[int]*usage{}
	for uid, other := range d.cp.Claims {
		if uid == pc.UID {
			continue
		}
		for _, dev := range other.Devices {
			if dev.AdminAccess || dev.MIG != nil {
				continue
			}
			u := used[dev.Index]
			if u == nil {
				u = &usage{}
				used[dev.Index] = u
			}
			if dev.Share == nil {
				u.wholeBy = other
				continue
			}
			u.mem += dev.Share.MemoryBytes
			u.cores += dev.Share.Cores
			u.shareClaims++
			u.add(other, dev.Share)
		}
	}
	for j, dev := range pc.Devices {
		if dev.AdminAccess || dev.MIG != nil {
			continue
		}
		field := resultField(resultIdx[j])
		u := used[dev.Index]
		if u == nil {
			u = &usage{}
			used[dev.Index] = u
		}
		if u.wholeBy != nil {
			return refuseBeside(logger, pc, u.wholeBy, fmt.Errorf("%s.device: %q is already prepared whole for another claim", field, dev.Device))
		}
		if dev.Share == nil {
			if u.shareClaims > 0 {
				return fmt.Errorf("%s.device: %q is allocated whole but %d share(s) of it are prepared for other claims", field, dev.Device, u.shareClaims)
			}
			continue
		}
		if by, err := u.check(pc, dev); err != nil {
			return refuseBeside(logger, pc, by, fmt.Errorf("%s.device: %w", field, err))
		}
		u.mem += dev.Share.MemoryBytes
		u.cores += dev.Share.Cores
		u.shareClaims++
		p, _ := d.topo.Position(dev.Index)
		// The claim's class may opt in to memory over-commit, as the
		// controller honours it: the shares then may add up to that
		// percentage of the GPU's memory.
		if total := d.topo.GPUs[p].MemoryBytes; total > 0 {
			limit, pct := total, dev.Share.MemoryOvercommitPercent
			if pct > 100 {
				limit = total / 100 * int64(pct)
			}
			if u.mem > limit {
				if pct > 100 {
					return fmt.Errorf("%s.consumedCapacity.%s: shares of %q would use %d bytes, more than %d%% of the GPU's %d (sharing.memoryOvercommitPercent)", field, driver.CapacityMemory, dev.Device, u.mem, pct, total)
				}
				return fmt.Errorf("%s.consumedCapacity.%s: shares of %q would use %d bytes, more than the GPU's %d", field, driver.CapacityMemory, dev.Device, u.mem, total)
			}
		}
		if u.cores > sliceformat.CoresTotal {
			return fmt.Errorf("%s.consumedCapacity.%s: shares of %q would use %d%% of the cores, more than the GPU's %d%%", field, driver.CapacityCores, dev.Device, u.cores, sliceformat.CoresTotal)
		}
	}
	return nil
}

// mpsGroups is what checkConflicts knows of a GPU's shares for the MPS
// modes: a Concurrent MPS share's limits are set by its own clients, in
// their environment, and the clients of its namespace on the GPU share
// one server, so a GPU with Concurrent shares may carry only Concurrent
// shares of that one namespace. A share of another namespace would need a
// second server (which the GPU time-slices against the first) and would
// not be protected from the group's clients raising their own limits; an
// Isolated MPS, HAMi-core or unlimited share no more. The controller
// places shares by the same rule.
type mpsGroups struct {
	// group is the namespace of the GPU's Concurrent MPS shares, groupBy
	// one of their claims; otherBy is a claim with a share of the GPU that
	// is not a Concurrent MPS share, other that share's kind.
	group            string
	groupBy, otherBy *PreparedClaim
	other            string
}

// add records another prepared claim's share.
func (g *mpsGroups) add(claim *PreparedClaim, s *PreparedShare) {
	if s.concurrentMPS() {
		g.group, g.groupBy = claim.Namespace, claim
		return
	}
	g.otherBy, g.other = claim, shareKind(s)
}

// check refuses dev, a share of pc, on a GPU whose shares it cannot join,
// and returns the prepared claim in the way. The message names the
// group's namespace only when it is pc's own.
func (g *mpsGroups) check(pc *PreparedClaim, dev PreparedDevice) (*PreparedClaim, error) {
	s := dev.Share
	switch {
	case s.concurrentMPS() && g.group != "" && g.group != pc.Namespace:
		return g.groupBy, fmt.Errorf("%q carries Concurrent MPS shares of another namespace, whose MPS server serves that namespace only: a Concurrent MPS share of namespace %s cannot join it",
			dev.Device, pc.Namespace)
	case s.concurrentMPS() && g.otherBy != nil:
		return g.otherBy, fmt.Errorf("%q carries a share that is not a Concurrent MPS share (%s, of another claim): a Concurrent MPS share's limits are set by its own clients, which that share would not be protected from, so it needs a GPU without other kinds of shares",
			dev.Device, g.other)
	case !s.concurrentMPS() && g.group != "":
		whose := "of another namespace"
		if g.group == pc.Namespace {
			whose = "of this claim's namespace " + pc.Namespace
		}
		return g.groupBy, fmt.Errorf("%q carries Concurrent MPS shares %s, whose clients set their own limits: this share (%s) would not be protected from them, so it cannot join the GPU",
			dev.Device, whose, shareKind(s))
	}
	return nil, nil
}

// refuseBeside returns err, a refusal of pc because of other, a claim
// prepared before it (perhaps another tenant's): err names nothing of
// other, since the kubelet shows it in pc's pods' events, so the plugin's
// log records which claim was in the way.
func refuseBeside(logger klog.Logger, pc, other *PreparedClaim, err error) error {
	logger.Info("Refusing a claim that conflicts with a prepared claim", "claim", klog.KRef(pc.Namespace, pc.Name), "claimUID", pc.UID,
		"preparedClaim", klog.KRef(other.Namespace, other.Name), "preparedClaimUID", other.UID, "reason", err.Error())
	return err
}

// shareKind names a share's mechanism in messages: "Isolated MPS",
// "Concurrent MPS", "HAMiCore" or "None".
func shareKind(s *PreparedShare) string {
	if s.Strategy != apiv1alpha1.SharingMPS {
		return string(s.Strategy)
	}
	return string(mpsModeName(s.concurrentMPS())) + " MPS"
}
