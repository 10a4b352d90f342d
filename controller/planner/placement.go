package planner

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/compat"
	"github.com/gpulink/gpulink/driver/allocate"
)

// Placement is a pod's own packing policy, where it has one: per field
// (across nodes, across a node's GPUs for shares) the strategy and where it
// came from; an empty strategy follows the controller's flags.
type Placement struct {
	node, gpu       allocate.Strategy
	nodeWhy, gpuWhy string
}

// PodPlacement reads the pod's packing policy: HAMi's pod annotations
// hami.io/node-scheduler-policy and hami.io/gpu-scheduler-policy (binpack
// or spread) first, then the placement of its pending claims'
// configuration (GpuConfig.placement, the class's then the claim's). One
// decision places all of a pod's claims, so claims asking for different
// strategies are an error naming them.
func PodPlacement(pod *corev1.Pod, pending []*Claim) (Placement, error) {
	var p Placement
	var errs []string
	fromAnnotation := func(key string, s *allocate.Strategy, why *string) {
		v, ok := pod.Annotations[key]
		if !ok {
			return
		}
		switch strings.ToLower(strings.TrimSpace(v)) {
		case "binpack":
			*s = allocate.Binpack
		case "spread":
			*s = allocate.Spread
		default:
			errs = append(errs, fmt.Sprintf("annotation %s=%q: want binpack or spread", key, v))
			return
		}
		*why = "annotation " + key
	}
	fromAnnotation(compat.AnnotationNodePolicy, &p.node, &p.nodeWhy)
	fromAnnotation(compat.AnnotationGPUPolicy, &p.gpu, &p.gpuWhy)

	fromClaims := func(field string, get func(*v1alpha1.PlacementConfig) v1alpha1.PlacementStrategy, s *allocate.Strategy, why *string) {
		if *s != "" {
			return // the pod's annotation decides
		}
		byValue := map[v1alpha1.PlacementStrategy][]string{}
		for _, ic := range pending {
			for _, r := range ic.Requests {
				for _, alt := range r.Alternatives {
					if alt.Config == nil || alt.Config.Placement == nil || get(alt.Config.Placement) == "" {
						continue
					}
					v := get(alt.Config.Placement)
					name := ic.Claim.Name
					if !slices.Contains(byValue[v], name) {
						byValue[v] = append(byValue[v], name)
					}
				}
			}
		}
		switch len(byValue) {
		case 0:
			return
		case 1:
			for v, claims := range byValue {
				*s = strategyOf(v)
				*why = "placement." + field + " of claim " + strings.Join(claims, ", ")
			}
		default:
			var parts []string
			for v, claims := range byValue {
				parts = append(parts, fmt.Sprintf("%s (claim %s)", v, strings.Join(claims, ", ")))
			}
			sort.Strings(parts)
			errs = append(errs, fmt.Sprintf("the pod's claims ask for different placement.%s: %s; one decision places all of a pod's claims, so give them one (or set the pod annotation %s)",
				field, strings.Join(parts, " and "), map[string]string{"node": compat.AnnotationNodePolicy, "gpu": compat.AnnotationGPUPolicy}[field]))
		}
	}
	fromClaims("node", func(c *v1alpha1.PlacementConfig) v1alpha1.PlacementStrategy { return c.Node }, &p.node, &p.nodeWhy)
	fromClaims("gpu", func(c *v1alpha1.PlacementConfig) v1alpha1.PlacementStrategy { return c.GPU }, &p.gpu, &p.gpuWhy)
	if len(errs) > 0 {
		return Placement{}, fmt.Errorf("%s", strings.Join(errs, "; "))
	}
	return p, nil
}

func strategyOf(v v1alpha1.PlacementStrategy) allocate.Strategy {
	if v == v1alpha1.PlacementSpread {
		return allocate.Spread
	}
	return allocate.Binpack
}

// apply overrides the policy's strategies with the pod's own.
func (p Placement) apply(pol allocate.Policy) allocate.Policy {
	if p.node != "" {
		pol.Node = p.node
	}
	if p.gpu != "" {
		pol.GPU = p.gpu
	}
	return pol
}

// Note says, for the allocation event, which strategies the pod chose
// itself and why ("" when it follows the controller's flags).
func (p Placement) Note() string {
	var parts []string
	if p.node != "" {
		parts = append(parts, fmt.Sprintf("nodes %s (%s)", p.node, p.nodeWhy))
	}
	if p.gpu != "" {
		parts = append(parts, fmt.Sprintf("GPUs %s (%s)", p.gpu, p.gpuWhy))
	}
	if len(parts) == 0 {
		return ""
	}
	return "; placed by the pod's own policy: " + strings.Join(parts, ", ")
}
