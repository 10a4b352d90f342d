package kubeletplugin

import (
	"context"
	"fmt"
	"maps"
	"time"

	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/dynamic-resource-allocation/resourceslice"
	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/topology"
	"github.com/gpulink/gpulink/internal/sliceformat"
)

// discover runs discovery and builds the node's slices from the result.
func (d *Driver) discover(ctx context.Context) (*topology.Topology, resourceslice.DriverResources, error) {
	t, err := d.discoverer.Discover(ctx)
	if err != nil {
		return nil, resourceslice.DriverResources{}, fmt.Errorf("discovering GPUs: %w", err)
	}
	notOnDemand := maps.Clone(d.migRefused)
	maps.Copy(notOnDemand, d.migWithheld)
	if err := d.migSelection.markOnDemand(t, notOnDemand); err != nil {
		return nil, resourceslice.DriverResources{}, err
	}
	d.withholdClaimedInstances(klog.FromContext(ctx), t)
	res, err := driverResources(klog.FromContext(ctx), d.opts.NodeName, t, sliceformat.Options{
		ManagedByController: d.opts.ManagedByController,
		DefaultShareMemory:  d.opts.DefaultShareMemory,
		DefaultShareCores:   d.opts.DefaultShareCores,
		PCIeRootFromSysfs:   d.opts.PCIeRootFromSysfs,
		MayTaint:            d.opts.Health != nil,
	})
	if err != nil {
		return nil, resourceslice.DriverResources{}, err
	}
	return t, res, nil
}

// Resources returns a copy of the slices the plugin publishes, unhealthy
// GPUs tainted.
func (d *Driver) Resources() resourceslice.DriverResources {
	d.mu.Lock()
	res := *d.resources.DeepCopy()
	d.mu.Unlock()
	d.applyHealthTaints(&res)
	return res
}

// RunPublisher publishes the current slices, then reruns discovery every
// RediscoverInterval and republishes when the result changed, and
// republishes when a GPU's health changed, until ctx ends. A failed
// rediscovery keeps the last good publication and is logged as an error.
func (d *Driver) RunPublisher(ctx context.Context, p Publisher) error {
	logger := klog.FromContext(ctx)
	if err := p.PublishResources(ctx, d.Resources()); err != nil {
		return fmt.Errorf("publishing ResourceSlices: %w", err)
	}
	d.metrics.Publications.Inc()
	logger.Info("Published ResourceSlices", "pool", d.opts.NodeName)
	var tick <-chan time.Time
	if d.opts.RediscoverInterval > 0 {
		ticker := d.clock.NewTicker(d.opts.RediscoverInterval)
		defer ticker.Stop()
		tick = ticker.C()
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-d.republish:
			if err := p.PublishResources(ctx, d.Resources()); err != nil {
				d.metrics.BackgroundErrors.Inc()
				logger.Error(err, "Republishing ResourceSlices after a health change failed, retrying at the next change or rediscovery")
				continue
			}
			d.metrics.Publications.Inc()
			logger.Info("GPU health changed, republished ResourceSlices", "pool", d.opts.NodeName)
			continue
		case <-tick:
		}
		changed, err := d.Rediscover(ctx)
		if err != nil {
			d.metrics.BackgroundErrors.Inc()
			logger.Error(err, "Rediscovery failed, keeping the published ResourceSlices")
			continue
		}
		if !changed {
			continue
		}
		if err := p.PublishResources(ctx, d.Resources()); err != nil {
			d.metrics.BackgroundErrors.Inc()
			logger.Error(err, "Republishing ResourceSlices failed")
			continue
		}
		d.metrics.Publications.Inc()
		logger.Info("GPUs changed, republished ResourceSlices", "pool", d.opts.NodeName)
	}
}

// Rediscover runs discovery again and reports whether the slices changed.
// Claims already prepared are unaffected: they are served and torn down
// from the checkpoint.
func (d *Driver) Rediscover(ctx context.Context) (bool, error) {
	t, res, err := d.discover(ctx)
	if err != nil {
		return false, err
	}
	d.mu.Lock()
	d.topo = t
	if equality.Semantic.DeepEqual(d.resources, &res) {
		d.mu.Unlock()
		return false, nil
	}
	d.resources = &res
	d.mu.Unlock()
	d.refreshHealthGauges(t)
	return true, nil
}
