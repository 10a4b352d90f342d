package planner

import (
	"fmt"
	"slices"

	"github.com/gpulink/gpulink/api/v1alpha1"
)

// checkShape holds a claim's placed results to what the kubelet plugin can
// prepare (kubeletplugin checkClaimShape), so that the controller never
// allocates a claim that then waits forever in ContainerCreating:
//   - the shares of one GPU take one sharing strategy;
//   - the claim's MPS shares come out at the same core percentage on every
//     GPU, because the claim's one MPS server applies one active thread
//     percentage to all its GPUs (HAMi's DRA demo double-gpu-0 asks 30 %
//     and 60 %: both on one GPU is 90 % there and fine, on two GPUs it is
//     not);
//   - a claim's concurrent MPS shares (sharing.mpsMode Concurrent) come out
//     on one GPU: their clients reach one MPS server, which serves one GPU.
//
// MPS shares beside whole GPUs or other shares are fine: the plugin gives
// each request its own view.
func (p *placer) checkShape(placed []PlacedResult) error {
	type gpuShare struct {
		strategy v1alpha1.SharingStrategy
		request  string
		cores    int64
	}
	byPos := map[int]*gpuShare{}
	var order []int
	for _, r := range placed {
		if r.Share == nil {
			continue
		}
		strategy := shareStrategy(r.Alt)
		for _, pos := range r.Positions {
			g := byPos[pos]
			if g == nil {
				g = &gpuShare{strategy: strategy, request: r.Alt.ResultName}
				byPos[pos] = g
				order = append(order, pos)
			} else if g.strategy != strategy {
				return fmt.Errorf("requests %s and %s would share device %s on node %s with sharing strategies %s and %s; one GPU takes one strategy",
					g.request, r.Alt.ResultName, p.node.Devices[pos].Name, p.node.Node, g.strategy, strategy)
			}
			g.cores += r.Share.Cores
		}
	}
	var concurrent []int
	for _, r := range placed {
		if r.Share != nil && r.Alt.ShareGroup != "" {
			for _, pos := range r.Positions {
				if !slices.Contains(concurrent, pos) {
					concurrent = append(concurrent, pos)
				}
			}
		}
	}
	if len(concurrent) > 1 {
		return fmt.Errorf("the claim's MPS shares (sharing.mpsMode=%s) would go to devices %s and %s on node %s; their clients reach one MPS server, which serves one GPU, so they must fit one GPU together",
			v1alpha1.MPSConcurrent, p.node.Devices[concurrent[0]].Name, p.node.Devices[concurrent[1]].Name, p.node.Node)
	}
	first := -1
	for _, pos := range order {
		g := byPos[pos]
		if g.strategy != v1alpha1.SharingMPS {
			continue
		}
		if first < 0 {
			first = pos
			continue
		}
		if f := byPos[first]; g.cores != f.cores {
			return fmt.Errorf("the claim's MPS shares would get %d%% of the cores of device %s and %d%% of device %s on node %s; the claim's MPS server applies one active thread percentage to all its GPUs, so they must come out equal (ask the same cores in every request, or use sharing strategy %s)",
				f.cores, p.node.Devices[first].Name, g.cores, p.node.Devices[pos].Name, p.node.Node, v1alpha1.SharingHAMiCore)
		}
	}
	return nil
}

// shareStrategy is the sharing strategy of a share alternative's
// effective configuration.
func shareStrategy(alt *Alternative) v1alpha1.SharingStrategy {
	if alt.Config != nil && alt.Config.Sharing != nil {
		return alt.Config.Sharing.Strategy
	}
	return ""
}

// placeMPSTogether places a claim whose placement broke checkShape again
// with its single MPS shares held to one device, each device in turn:
// placed one by one, double-gpu-0's 30 % share may take the GPU that has
// 40 % left and its 60 % share another, while a GPU with 90 % left holds
// both. The first device that works wins.
func (p *placer) placeMPSTogether(ic *Claim) ([]PlacedResult, bool) {
	defer func() { p.mpsPin = -1 }()
	for pos := range p.node.Devices {
		p.mpsPin = pos
		if res, ok := p.placeFrom(ic, 0, make([]string, len(ic.Constraints)), nil); ok {
			return res, true
		}
	}
	return nil, false
}
