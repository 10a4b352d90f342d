package planner

import (
	"context"
	"fmt"

	"k8s.io/klog/v2"

	"github.com/gpulink/gpulink/driver/allocate"
)

// MixConfig configures the recent size mix (driver/allocate.SizeHistory)
// the controller passes to the allocator as Policy.Mix.
type MixConfig struct {
	// Window is how many recent whole-GPU requests the mix counts; 0
	// means allocate.DefaultHistoryWindow and a negative value turns the
	// recent mix off (Policy.Mix, or the allocator's default, is used).
	Window int
	// Refresh is how many requests pass between two snapshots of the mix;
	// 0 means allocate.DefaultHistoryRefresh (at most Window).
	Refresh int
}

// MixRecorder keeps the sizes of the requests the controller is asked to
// decide. Each claim counts once, when it is first decided (a pod that
// waits and retries is not counted again), with its preferred
// alternative: whole GPUs only, since shares and allocationMode All take
// no fixed number of whole GPUs from the free ones. Only decisions touch
// it, under Controller.decideMu, so its sequence is the decisions' order
// and the mix of every decision is a function of the requests before it.
type MixRecorder struct {
	Hist   *allocate.SizeHistory // nil: off
	seen   *lru[struct{}]        // claims already counted
	logged *allocate.SizeMix     // the last snapshot logged
	held   *allocate.SizeMix     // the mix decisions use (HoldSize)
}

func NewMixRecorder(cfg MixConfig) (*MixRecorder, error) {
	if cfg.Window < 0 {
		return &MixRecorder{}, nil
	}
	window, refresh := cfg.Window, cfg.Refresh
	if window == 0 {
		window = allocate.DefaultHistoryWindow
	}
	if refresh == 0 {
		refresh = min(allocate.DefaultHistoryRefresh, window)
	}
	h, err := allocate.NewSizeHistory(window, refresh)
	if err != nil {
		return nil, fmt.Errorf("mix: %w", err)
	}
	// Twice the window: a claim that waits while a window of others
	// passes may be counted again, which is what the window forgets
	// anyway.
	return &MixRecorder{Hist: h, seen: newLRU[struct{}](2 * window)}, nil
}

// Policy records the pending claims' sizes and returns base with the
// recent mix (base unchanged when the recorder is off).
func (r *MixRecorder) Policy(ctx context.Context, base allocate.Policy, pending []*Claim) allocate.Policy {
	if r.Hist == nil {
		return base
	}
	for _, ic := range pending {
		uid := string(ic.Claim.UID)
		if _, ok := r.seen.get(uid); ok {
			continue
		}
		r.seen.put(uid, struct{}{})
		for _, rs := range ic.Requests {
			if len(rs.Alternatives) == 0 {
				continue
			}
			// MIG requests are no whole-GPU sizes: they never take a GPU.
			if a := rs.Alternatives[0]; !a.Share && !a.All && !a.MIG {
				r.Hist.Record(a.Count)
			}
		}
	}
	if m := r.Hist.Mix(); m != r.logged {
		r.logged = m
		// The counts replay this mix in `gpulink simulate` (sizeMix).
		klog.FromContext(ctx).V(2).Info("Request size mix", "counts", r.Hist.String(), "requests", r.Hist.Recorded())
	}
	// A snapshot near the one in use keeps it, and with it the kept node
	// scores that depend on the mix (allocate.HoldSize).
	r.held = allocate.HoldSize(r.held, r.Hist.Mix())
	base.Mix = r.held
	return base
}
