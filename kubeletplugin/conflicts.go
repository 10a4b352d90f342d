package kubeletplugin

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// checkConflicts is the last line of defense against double allocation:
// a GPU given whole must not be in any other prepared claim, shares of
// one GPU must fit into it together, in memory and in cores (as the
// controller counts them), and a GPU with Concurrent MPS shares carries
// only Concurrent MPS shares of one namespace (checkMPSGroups).
// Admin-access results are exempt.
func (d *Driver) checkConflicts(pc *PreparedClaim, resultIdx []int) error {
	type usage struct {
		wholeBy     types.UID
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
				u.wholeBy = uid
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
		if u.wholeBy != "" {
			return fmt.Errorf("%s.device: %q is already prepared whole for claim UID %s", field, dev.Device, u.wholeBy)
		}
		if dev.Share == nil {
			if u.shareClaims > 0 {
				return fmt.Errorf("%s.device: %q is allocated whole but %d share(s) of it are prepared for other claims", field, dev.Device, u.shareClaims)
			}
			continue
		}
		if err := u.check(pc, dev); err != nil {
			return fmt.Errorf("%s.device: %w", field, err)
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
	groupBy, otherBy types.UID
	other            string
}

// add records another prepared claim's share.
func (g *mpsGroups) add(claim *PreparedClaim, s *PreparedShare) {
	if s.concurrentMPS() {
		g.group, g.groupBy = claim.Namespace, claim.UID
		return
	}
	g.otherBy, g.other = claim.UID, shareKind(s)
}

// check refuses dev, a share of pc, on a GPU whose shares it cannot join.
func (g *mpsGroups) check(pc *PreparedClaim, dev PreparedDevice) error {
	s := dev.Share
	switch {
	case s.concurrentMPS() && g.group != "" && g.group != pc.Namespace:
		return fmt.Errorf("%q carries Concurrent MPS shares of namespace %s (claim UID %s), whose MPS server serves that namespace only: a Concurrent MPS share of namespace %s cannot join it",
			dev.Device, g.group, g.groupBy, pc.Namespace)
	case s.concurrentMPS() && g.otherBy != "":
		return fmt.Errorf("%q carries a share that is not a Concurrent MPS share (%s, claim UID %s): a Concurrent MPS share's limits are set by its own clients, which that share would not be protected from, so it needs a GPU without other kinds of shares",
			dev.Device, g.other, g.otherBy)
	case !s.concurrentMPS() && g.group != "":
		return fmt.Errorf("%q carries Concurrent MPS shares of namespace %s (claim UID %s), whose clients set their own limits: this share (%s) would not be protected from them, so it cannot join the GPU",
			dev.Device, g.group, g.groupBy, shareKind(s))
	}
	return nil
}

// shareKind names a share's mechanism in messages: "Isolated MPS",
// "Concurrent MPS", "HAMiCore" or "None".
func shareKind(s *PreparedShare) string {
	if s.Strategy != apiv1alpha1.SharingMPS {
		return string(s.Strategy)
	}
	return string(mpsModeName(s.concurrentMPS())) + " MPS"
}
