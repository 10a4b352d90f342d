package compat

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/gpulink/gpulink/driver"
)

// Names gpulink puts on what it translates.
const (
	// LabelManaged marks the ResourceClaimTemplates the translation
	// creates (and garbage-collects) and the pods it translated.
	LabelManaged = "gpu.gpulink.dev/compat"
	// AnnotationTranslated on a pod says what its extended resources
	// became, for the Normal event and for users.
	AnnotationTranslated = "gpu.gpulink.dev/translated"
	// TemplatePrefix starts the name of every template the translation
	// creates; the rest is a hash of the template's claim spec
	// (TemplateName).
	TemplatePrefix = "gpulink-compat-"
	// RequestName is the request of every translated template.
	RequestName = "gpu"
)

// Inventory says which GPU memory sizes the cluster has. It is nil or
// empty while no gpulink ResourceSlice is known; then only the checks that
// need it are put off (the controller reports them as Warning events).
type Inventory interface {
	// MemorySizes returns the distinct memory capacities in bytes of
	// the published gpulink GPUs, ascending.
	MemorySizes() []int64
}

// Translator turns device-plugin resources of a pod into gpulink claims.
type Translator struct {
	Config    Config
	Inventory Inventory
}

// Shape is what one container asks for.
type Shape struct {
	Count int64
	// Share: a share of each GPU, sized by Memory (bytes per GPU) or
	// MemoryPercent, and Cores (percent); zero means the share class's
	// default size.
	Share         bool
	Memory        int64
	MemoryPercent int64
	Cores         int64
	// MIG, when set, asks for MIG devices instead: "<profile>=<count>"
	// per profile, sorted by profile, comma-separated (a string, so that
	// Shape stays comparable); Count is then their total.
	MIG string
	// Priority is HAMi's task priority (0 high, 1 low) when HasPriority;
	// it goes into the claim's opaque config as sharing.priority.
	Priority    int
	HasPriority bool
	// From says which resources and values the shape was read from.
	From string
}

func (s Shape) String() string {
	prio := ""
	if s.HasPriority {
		prio = ", " + priorityName(s.Priority)
	}
	if s.MIG != "" {
		var parts []string
		for _, p := range migProfiles(s.MIG) {
			parts = append(parts, fmt.Sprintf("%d %s", p.count, p.profile))
		}
		return "MIG devices " + strings.Join(parts, " + ")
	}
	if !s.Share {
		return fmt.Sprintf("%d whole GPU(s)%s", s.Count, prio)
	}
	var parts []string
	switch {
	case s.Memory > 0:
		parts = append(parts, "memory "+resource.NewQuantity(s.Memory, resource.BinarySI).String())
	case s.MemoryPercent > 0:
		parts = append(parts, fmt.Sprintf("memory %d%%", s.MemoryPercent))
	default:
		parts = append(parts, "default memory")
	}
	if s.Cores > 0 {
		parts = append(parts, fmt.Sprintf("cores %d%%", s.Cores))
	} else {
		parts = append(parts, "default cores")
	}
	return fmt.Sprintf("%d share(s) of one GPU each (%s)%s", s.Count, strings.Join(parts, ", "), prio)
}

// ContainerClaim is one translated container.
type ContainerClaim struct {
	Init      bool
	Index     int
	Container string
	// ClaimName is the entry in pod.spec.resourceClaims, Template the
	// ResourceClaimTemplate it is created from.
	ClaimName string
	Template  string
	Shape     Shape
}

// Result is a translated pod and the templates it needs.
type Result struct {
	Pod       *corev1.Pod
	Templates map[string]resourceapi.ResourceClaimTemplateSpec
	Claims    []ContainerClaim
}

// Summary says what the pod was translated into, one clause per container.
func (r *Result) Summary() string {
	parts := make([]string, len(r.Claims))
	for i, c := range r.Claims {
		kind := "container"
		if c.Init {
			kind = "init container"
		}
		parts[i] = fmt.Sprintf("%s %s: %s -> claim %s from template %s (%s)", kind, c.Container, c.Shape.From, c.ClaimName, c.Template, c.Shape)
	}
	return strings.Join(parts, "; ")
}

// Translate returns the pod with the configured extended resources of its
// containers and init containers replaced by resource claims, or nil when
// the pod uses none. Every bad value is an error naming the container, the
// resource and the value; nothing is translated then.
func (t *Translator) Translate(pod *corev1.Pod) (*Result, error) {
	type found struct {
		init bool
		// regularInit: an init container that runs to completion before
		// the next one and before the app containers start (not a
		// restartable sidecar, which runs alongside them).
		regularInit bool
		index       int
		name        string
		shape       Shape
	}
	var asks []found
	var errs []error
	visit := func(init bool, cs []corev1.Container) {
		for i := range cs {
			shape, ok, err := t.shape(&cs[i])
			if err != nil {
				kind := "container"
				if init {
					kind = "init container"
				}
				errs = append(errs, fmt.Errorf("%s %q: %w", kind, cs[i].Name, err))
				continue
			}
			if ok {
				sidecar := cs[i].RestartPolicy != nil && *cs[i].RestartPolicy == corev1.ContainerRestartPolicyAlways
				asks = append(asks, found{init: init, regularInit: init && !sidecar, index: i, name: cs[i].Name, shape: shape})
			}
		}
	}
	visit(true, pod.Spec.InitContainers)
	visit(false, pod.Spec.Containers)
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	// A pod without any translated resource is none of our business, even
	// if it carries HAMi annotations.
	if len(asks) == 0 && !t.usesAny(pod) {
		return nil, nil
	}
	var selectors []string
	if t.Config.NVIDIA.Enabled && t.Config.NVIDIA.Annotations {
		var err error
		if selectors, err = annotationSelectors(pod.Annotations); err != nil {
			return nil, err
		}
	}

	out := pod.DeepCopy()
	res := &Result{Pod: out, Templates: map[string]resourceapi.ResourceClaimTemplateSpec{}}
	taken := map[string]bool{}
	for _, rc := range pod.Spec.ResourceClaims {
		taken[rc.Name] = true
	}
	// Which claim each container uses. Containers that run at the same
	// time (app containers, restartable sidecars) get a claim each, so
	// each has its own devices as with the device plugin. A regular init
	// container has finished before the next container starts, so, as the
	// device plugin hands its devices on, it uses the claim of a container
	// asking for the same shape that never runs beside it: an app
	// container's first, then another regular init container's, then a
	// sidecar's that starts after it; only then a claim of its own, rather
	// than holding GPUs for the pod's life.
	claimOf := make([]string, len(asks))
	type owner struct {
		claim string
		// sidecarIndex is the owner's place among the init containers
		// when it is a restartable sidecar, -1 otherwise.
		sidecarIndex int
		regularInit  bool
	}
	byShape := map[Shape][]owner{}
	shapeKey := func(s Shape) Shape { s.From = ""; return s }
	// App containers first, then sidecars, then regular init containers,
	// so that a regular init container finds them all.
	order := func(a found) int {
		switch {
		case !a.init:
			return 0
		case !a.regularInit:
			return 1
		default:
			return 2
		}
	}
	for pass := range 3 {
		for i, a := range asks {
			if order(a) != pass {
				continue
			}
			key := shapeKey(a.shape)
			if a.regularInit {
				best, bestRank := "", 3
				for _, o := range byShape[key] {
					rank := 0 // an app container's
					switch {
					case o.regularInit:
						rank = 1
					case o.sidecarIndex >= 0 && o.sidecarIndex < a.index:
						continue // started before it: runs beside it
					case o.sidecarIndex >= 0:
						rank = 2
					}
					if rank < bestRank {
						best, bestRank = o.claim, rank
					}
				}
				if best != "" {
					claimOf[i] = best
					continue
				}
			}
			claimOf[i] = claimName(a.init, a.index, a.name, taken)
			taken[claimOf[i]] = true
			o := owner{claim: claimOf[i], sidecarIndex: -1, regularInit: a.regularInit}
			if a.init && !a.regularInit {
				o.sidecarIndex = a.index
			}
			byShape[key] = append(byShape[key], o)
		}
	}
	added := map[string]bool{}
	for i, a := range asks {
		spec, err := t.template(a.shape, selectors)
		if err != nil {
			return nil, fmt.Errorf("container %q: %w", a.name, err)
		}
		name, err := TemplateName(spec.Spec)
		if err != nil {
			return nil, err
		}
		res.Templates[name] = spec
		claim := claimOf[i]
		c := &out.Spec.Containers
		if a.init {
			c = &out.Spec.InitContainers
		}
		ctr := &(*c)[a.index]
		t.strip(&ctr.Resources)
		ctr.Resources.Claims = append(ctr.Resources.Claims, corev1.ResourceClaim{Name: claim})
		if !added[claim] {
			added[claim] = true
			out.Spec.ResourceClaims = append(out.Spec.ResourceClaims, corev1.PodResourceClaim{Name: claim, ResourceClaimTemplateName: ptr.To(name)})
		}
		res.Claims = append(res.Claims, ContainerClaim{Init: a.init, Index: a.index, Container: a.name, ClaimName: claim, Template: name, Shape: a.shape})
	}
	// Zero counts (nvidia.com/gpu: 0) are dropped from every container.
	for i := range out.Spec.InitContainers {
		t.strip(&out.Spec.InitContainers[i].Resources)
	}
	for i := range out.Spec.Containers {
		t.strip(&out.Spec.Containers[i].Resources)
	}
	if len(res.Claims) > 0 {
		if out.Labels == nil {
			out.Labels = map[string]string{}
		}
		out.Labels[LabelManaged] = "true"
		if out.Annotations == nil {
			out.Annotations = map[string]string{}
		}
		out.Annotations[AnnotationTranslated] = res.Summary()
		// The templates travel with the pod: the webhook creates
		// nothing, the controller's leader creates them for the pods
		// that exist.
		enc, err := EncodeTemplates(res.Templates)
		if err != nil {
			return nil, err
		}
		out.Annotations[AnnotationTemplates] = enc
		addGate(out)
	}
	return res, nil
}

// addGate holds the pod for the controller. The chart's admission policy
// gates pods with resource claims, but it may run before this translation
// (and is not reinvoked), so the translation gates its pods itself. A pod
// bound at creation (spec.nodeName) cannot carry gates.
func addGate(pod *corev1.Pod) {
	if pod.Spec.NodeName != "" {
		return
	}
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == driver.SchedulingGate {
			return
		}
	}
	pod.Spec.SchedulingGates = append(pod.Spec.SchedulingGates, corev1.PodSchedulingGate{Name: driver.SchedulingGate})
}

func claimName(init bool, index int, container string, taken map[string]bool) string {
	name := "gpulink-" + container
	if len(name) <= 63 && !taken[name] {
		return name
	}
	prefix := "gpulink-c"
	if init {
		prefix = "gpulink-init"
	}
	for n := 0; ; n++ {
		name = prefix + strconv.Itoa(index)
		if n > 0 {
			name += "-" + strconv.Itoa(n)
		}
		if !taken[name] {
			return name
		}
	}
}
