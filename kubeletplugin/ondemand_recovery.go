package kubeletplugin

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/discovery"
	"github.com/gpulink/gpulink/driver/mig"
	"github.com/gpulink/gpulink/driver/topology"
)

// reconcileOnDemand runs at start, after interrupted prepares were rolled
// back: it adopts the GPUs named by --mig-on-demand that hold no foreign
// instances, refuses the others (logged), and on adopted GPUs destroys
// the instances no prepared claim holds. It reports whether it changed
// what the node publishes (a refusal) or has (a destroyed orphan).
func (d *Driver) reconcileOnDemand(ctx context.Context) (bool, error) {
	logger := klog.FromContext(ctx)
	if d.migSelection.empty() || d.topo == nil {
		return false, nil
	}
	held := map[string]map[[3]int]types.UID{} // parent UUID -> (profile, start, size) -> claim
	for uid, pc := range d.cp.Claims {
		for _, dev := range pc.Devices {
			if dev.MIG == nil || dev.MIG.OnDemand == nil {
				continue
			}
			m := held[dev.MIG.ParentUUID]
			if m == nil {
				m = map[[3]int]types.UID{}
				held[dev.MIG.ParentUUID] = m
			}
			o := dev.MIG.OnDemand
			m[[3]int{o.GIProfileID, o.Placement.Start, o.Placement.Size}] = uid
		}
	}
	changed := false
	adopted := map[string]bool{}
	for _, u := range d.cp.OnDemandGPUs {
		adopted[u] = true
	}
	withheld := map[string]bool{}
	for _, u := range d.cp.WithheldGPUs {
		withheld[u] = true
	}
	var keep, keepWithheld []string
	for _, g := range d.topo.GPUs {
		if !g.MIGEnabled() || !g.MIG.OnDemand {
			continue
		}
		if d.migInstances == nil {
			return false, fmt.Errorf("--mig-on-demand: GPU %d: this discovery backend cannot create MIG instances", g.Index)
		}
		gis, err := d.migInstances.GPUInstances(ctx, g.UUID)
		if err != nil {
			return false, fmt.Errorf("--mig-on-demand: listing the MIG instances of GPU %d: %w", g.Index, err)
		}
		var foreign []discovery.GPUInstance
		for _, gi := range gis {
			if _, ok := held[g.UUID][[3]int{gi.ProfileID, gi.Placement.Start, gi.Placement.Size}]; !ok {
				foreign = append(foreign, gi)
			}
		}
		if len(foreign) > 0 && (withheld[g.UUID] || (!adopted[g.UUID] && d.stateLost)) {
			// The checkpoint that said whose they are was lost: they may
			// be running pods' partitions. Destroying them would break
			// those pods, publishing them as static MIG devices would put
			// a second tenant on them: neither, until they are gone.
			d.migWithheld[g.UUID] = describeInstances(foreign)
			logger.Error(nil, "GPU is named by --mig-on-demand and has MIG instances whose owners were lost with a corrupt checkpoint; publishing no devices of it until they are gone. Once no pod uses them, destroy them (nvidia-smi mig -i <index> -dci; nvidia-smi mig -i <index> -dgi) and restart the plugin",
				"gpu", g.Index, "uuid", g.UUID, "instances", d.migWithheld[g.UUID])
			keepWithheld = append(keepWithheld, g.UUID)
			changed = true
			continue
		}
		if !adopted[g.UUID] && len(foreign) > 0 {
			d.migRefused[g.UUID] = describeInstances(foreign)
			logger.Error(nil, "GPU is named by --mig-on-demand but has MIG instances gpulink did not create; publishing its instances as static MIG devices instead. Destroy them (nvidia-smi mig -i <index> -dci; nvidia-smi mig -i <index> -dgi) and restart the plugin to partition it on demand",
				"gpu", g.Index, "uuid", g.UUID, "instances", d.migRefused[g.UUID])
			changed = true
			continue
		}
		for _, gi := range foreign {
			// Ours (the GPU is adopted) and no prepared claim's: left by a
			// crash between creating it and recording the claim's end.
			if err := d.migInstances.Destroy(ctx, g.UUID, gi.ProfileID, gi.Placement); err != nil {
				logger.Error(err, "Destroying an orphaned MIG instance failed; the next start tries again", "gpu", g.Index, "gpuInstance", gi.ID, "placement", gi.Placement)
				continue
			}
			changed = true
			logger.Info("Destroyed orphaned MIG instance that no prepared claim holds", "gpu", g.Index, "gpuInstance", gi.ID, "profile", gi.ProfileID, "placement", gi.Placement)
		}
		keep = append(keep, g.UUID)
	}
	slices.Sort(keep)
	slices.Sort(keepWithheld)
	if !slices.Equal(keep, d.cp.OnDemandGPUs) || !slices.Equal(keepWithheld, d.cp.WithheldGPUs) {
		d.cp.OnDemandGPUs, d.cp.WithheldGPUs = keep, keepWithheld
		d.dirty = true
	}
	return changed, nil
}

// withholdClaimedInstances removes from t the MIG instances that prepared
// claims' partitions created, on GPUs t does not show as partitioned on
// demand: a GPU left out of --mig-on-demand since, or refused at start;
// and every instance of a withheld GPU (Checkpoint.WithheldGPUs).
// Listed, they would be published as static MIG devices and handed to a
// second tenant, whose unprepare would not destroy them but whose
// containers would share them with the first tenant's; the conflict
// check (checkMIGConflicts) refuses such a claim too. Instances of GPUs
// partitioned on demand are never published (their partitions are).
func (d *Driver) withholdClaimedInstances(logger klog.Logger, t *topology.Topology) {
	type key struct {
		parent      string
		start, size int
	}
	claimed := map[key]bool{}
	d.mu.Lock()
	if d.cp != nil {
		for _, pc := range d.cp.Claims {
			for _, dev := range pc.Devices {
				if dev.MIG != nil && dev.MIG.OnDemand != nil {
					claimed[key{dev.MIG.ParentUUID, dev.MIG.OnDemand.Placement.Start, dev.MIG.OnDemand.Placement.Size}] = true
				}
			}
		}
	}
	d.mu.Unlock()
	if len(claimed) == 0 && len(d.migWithheld) == 0 {
		return
	}
	for i := range t.GPUs {
		g := &t.GPUs[i]
		if !g.MIGEnabled() || g.MIG.OnDemand {
			continue
		}
		_, withheld := d.migWithheld[g.UUID]
		kept := make([]mig.Instance, 0, len(g.MIG.Instances))
		for _, in := range g.MIG.Instances {
			if withheld || claimed[key{g.UUID, in.Placement.Start, in.Placement.Size}] {
				logger.V(2).Info("Not publishing a MIG instance that a prepared claim's partition created", "gpu", g.Index, "gi", in.GI, "ci", in.CI, "placement", in.Placement)
				continue
			}
			kept = append(kept, in)
		}
		if len(kept) != len(g.MIG.Instances) {
			// A copy: the discoverer may hand out its topology again.
			m := *g.MIG
			m.Instances = kept
			g.MIG = &m
		}
	}
}

// holdsPartitions tells whether a prepared claim holds a partition.
func (cp *Checkpoint) holdsPartitions() bool {
	for _, pc := range cp.Claims {
		for _, dev := range pc.Devices {
			if dev.MIG != nil && dev.MIG.OnDemand != nil {
				return true
			}
		}
	}
	return false
}

// describeInstances lists GPU instances for a log line.
func describeInstances(gis []discovery.GPUInstance) string {
	parts := make([]string, 0, len(gis))
	for _, gi := range gis {
		parts = append(parts, fmt.Sprintf("GI %d (profile %d) at %d+%d", gi.ID, gi.ProfileID, gi.Placement.Start, gi.Placement.Size))
	}
	return strings.Join(parts, ", ")
}
