package kubeletplugin

import (
	"context"

	"k8s.io/klog/v2"
)

// runMPSLimits sets every MPS daemon's limits again every
// Options.MPSLimitInterval until ctx ends (see mps.LimitEnforcer for why),
// after retrying the daemons kept after a start without a definite
// answer (mps.ErrDaemonKept).
func (d *Driver) runMPSLimits(ctx context.Context) {
	if d.opts.MPSLimitInterval <= 0 {
		return
	}
	logger := klog.FromContext(ctx).WithName("mps-limits")
	ticker := d.clock.NewTicker(d.opts.MPSLimitInterval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-ticker.C():
		}
		// Another instance may have stopped daemons (rolling.go).
		if err := d.syncMPSRefs(ctx); err != nil {
			logger.Error(err, "Reading the checkpoint before setting MPS limits again failed")
			continue
		}
		// Daemons whose start at plugin start (or in a prepare) got no
		// definite answer were kept with their references: try again.
		if failed, err := d.mps.RetryKept(ctx); err != nil {
			logger.Error(err, "Starting MPS control daemons that were kept after an unclear failure failed again; retrying at the next interval", "daemons", failed)
		}
		failed, err := d.mps.ReassertLimits(ctx)
		if err != nil {
			logger.Error(err, "Setting the limits of MPS control daemons again failed; their claims' containers may run above their share until the next try", "claimUIDs", failed)
		}
	}
}
