package compat

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"

	v1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
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

// ResourceNames returns the extended resource names the translation takes
// off pods (those of the enabled families), besides those starting with
// one of ResourcePrefixes.
func (t *Translator) ResourceNames() []corev1.ResourceName {
	return t.names()
}

// ResourcePrefixes returns the prefixes of the resource names the
// translation takes off pods: the MIG resources' (nvidia.com/mig-), when on.
func (t *Translator) ResourcePrefixes() []string {
	if t.Config.NVIDIA.Enabled && t.Config.NVIDIA.MIG {
		return []string{t.Config.NVIDIA.MIGPrefix}
	}
	return nil
}

// isMIGName tells whether a resource name is a MIG resource the
// translation takes.
func (t *Translator) isMIGName(n corev1.ResourceName) bool {
	for _, p := range t.ResourcePrefixes() {
		if strings.HasPrefix(string(n), p) {
			return true
		}
	}
	return false
}

// names returns the enabled resource names.
func (t *Translator) names() []corev1.ResourceName {
	c := t.Config
	var n []string
	if c.NVIDIA.Enabled {
		n = append(n, c.NVIDIA.GPU, c.NVIDIA.Memory, c.NVIDIA.MemoryPercentage, c.NVIDIA.Cores, c.NVIDIA.Priority)
	}
	if c.Aliyun.Enabled {
		n = append(n, c.Aliyun.GPU)
	}
	if c.Tencent.Enabled {
		n = append(n, c.Tencent.Cores, c.Tencent.Memory)
	}
	out := make([]corev1.ResourceName, len(n))
	for i, s := range n {
		out[i] = corev1.ResourceName(s)
	}
	return out
}

func (t *Translator) usesAny(pod *corev1.Pod) bool {
	for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range cs {
			for _, n := range t.names() {
				if _, ok := cs[i].Resources.Limits[n]; ok {
					return true
				}
				if _, ok := cs[i].Resources.Requests[n]; ok {
					return true
				}
			}
			for _, l := range []corev1.ResourceList{cs[i].Resources.Limits, cs[i].Resources.Requests} {
				for n := range l {
					if t.isMIGName(n) {
						return true
					}
				}
			}
		}
	}
	return false
}

func (t *Translator) strip(r *corev1.ResourceRequirements) {
	for _, n := range t.names() {
		delete(r.Limits, n)
		delete(r.Requests, n)
	}
	for _, l := range []corev1.ResourceList{r.Limits, r.Requests} {
		for n := range l {
			if t.isMIGName(n) {
				delete(l, n)
			}
		}
	}
	if len(r.Limits) == 0 {
		r.Limits = nil
	}
	if len(r.Requests) == 0 {
		r.Requests = nil
	}
}

// value reads one extended resource of a container: limits, else
// requests (extended resources cannot be over-committed, so both must
// agree), as a non-negative integer.
func value(r *corev1.ResourceRequirements, name string) (int64, bool, error) {
	n := corev1.ResourceName(name)
	lim, hasLim := r.Limits[n]
	req, hasReq := r.Requests[n]
	if !hasLim && !hasReq {
		return 0, false, nil
	}
	q := lim
	if !hasLim {
		q = req
	} else if hasReq && req.Cmp(lim) != 0 {
		return 0, true, fmt.Errorf("%s: requests %s differ from limits %s (an extended resource cannot be over-committed)", name, req.String(), lim.String())
	}
	if q.Sign() < 0 {
		return 0, true, fmt.Errorf("%s: %s is negative", name, q.String())
	}
	v, ok := q.AsInt64()
	if !ok {
		return 0, true, fmt.Errorf("%s: %s is not a whole number", name, q.String())
	}
	return v, true, nil
}

// shape reads what a container asks for; ok is false when it asks for
// nothing this configuration translates.
func (t *Translator) shape(c *corev1.Container) (Shape, bool, error) {
	type val struct {
		name string
		v    int64
		set  bool
	}
	var errs []error
	read := func(name string) val {
		v, set, err := value(&c.Resources, name)
		if err != nil {
			errs = append(errs, err)
		}
		return val{name, v, set}
	}
	var families []Shape
	var used []string
	cfg := t.Config
	if cfg.NVIDIA.Enabled {
		gpu, mem, pct, cores := read(cfg.NVIDIA.GPU), read(cfg.NVIDIA.Memory), read(cfg.NVIDIA.MemoryPercentage), read(cfg.NVIDIA.Cores)
		prio := read(cfg.NVIDIA.Priority)
		var mig Shape
		var migOK bool
		if cfg.NVIDIA.MIG {
			var err error
			if mig, migOK, err = t.migShape(c); err != nil {
				errs = append(errs, err)
			}
		}
		if len(errs) == 0 {
			s, ok, err := t.nvidia(gpu.v, gpu.set, mem.v, mem.set, pct.v, pct.set, cores.v, cores.set)
			switch {
			case err == nil && migOK && ok:
				err = fmt.Errorf("asks for MIG devices (%s) and for whole GPUs or shares (%s) together; a container gets one kind", mig.From, s.From)
			case err == nil && migOK && prio.set:
				err = fmt.Errorf("%s: %d with MIG devices (%s): a task priority orders the work of a shared GPU and a MIG device is never shared; drop it", cfg.NVIDIA.Priority, prio.v, mig.From)
			case err == nil && migOK:
				s, ok = mig, true
			case err == nil && prio.set:
				s, ok, err = t.withPriority(s, ok, prio.v)
			}
			if err != nil {
				errs = append(errs, err)
			} else if ok {
				families = append(families, s)
				used = append(used, "nvidia")
			}
		}
	}
	if cfg.Aliyun.Enabled {
		gpu := read(cfg.Aliyun.GPU)
		if len(errs) == 0 && gpu.set && gpu.v > 0 {
			families = append(families, Shape{Count: gpu.v, From: fmt.Sprintf("%s: %d", gpu.name, gpu.v)})
			used = append(used, "aliyun")
		}
	}
	if cfg.Tencent.Enabled {
		cores, mem := read(cfg.Tencent.Cores), read(cfg.Tencent.Memory)
		if len(errs) == 0 {
			s, ok, err := t.tencent(cores.v, cores.set, mem.v, mem.set)
			if err != nil {
				errs = append(errs, err)
			} else if ok {
				families = append(families, s)
				used = append(used, "tencent")
			}
		}
	}
	if err := errors.Join(errs...); err != nil {
		return Shape{}, false, err
	}
	switch len(families) {
	case 0:
		return Shape{}, false, nil
	case 1:
		s := families[0]
		return s, true, t.checkInventory(s)
	default:
		return Shape{}, false, fmt.Errorf("asks for GPUs through more than one device-plugin family (%s: %s); use one", strings.Join(used, ", "), families[0].From+"; "+families[1].From)
	}
}

func (t *Translator) nvidia(gpu int64, gpuSet bool, mem int64, memSet bool, pct int64, pctSet bool, cores int64, coresSet bool) (Shape, bool, error) {
	n := t.Config.NVIDIA
	share := memSet || pctSet || coresSet
	var from []string
	if gpuSet {
		from = append(from, fmt.Sprintf("%s: %d", n.GPU, gpu))
	}
	if memSet {
		from = append(from, fmt.Sprintf("%s: %d", n.Memory, mem))
	}
	if pctSet {
		from = append(from, fmt.Sprintf("%s: %d", n.MemoryPercentage, pct))
	}
	if coresSet {
		from = append(from, fmt.Sprintf("%s: %d", n.Cores, cores))
	}
	if !gpuSet && !share {
		return Shape{}, false, nil
	}
	s := Shape{Count: gpu, Share: share, From: strings.Join(from, ", ")}
	if !gpuSet {
		// HAMi's default when only memory or cores are given: one GPU.
		s.Count = 1
	}
	if gpuSet && gpu == 0 {
		if share {
			return Shape{}, false, fmt.Errorf("%s: 0 with %s: a share needs at least one GPU", n.GPU, s.From)
		}
		return Shape{}, false, nil
	}
	if !share {
		return s, true, nil
	}
	var errs []error
	if memSet && pctSet {
		errs = append(errs, fmt.Errorf("%s: %d and %s: %d both size the memory; use one", n.Memory, mem, n.MemoryPercentage, pct))
	}
	if memSet {
		if mem <= 0 {
			errs = append(errs, fmt.Errorf("%s: %d must be positive", n.Memory, mem))
		}
		unit := n.MemoryUnit.Value()
		if mem > (1<<62)/unit {
			errs = append(errs, fmt.Errorf("%s: %d is too large", n.Memory, mem))
		}
		s.Memory = mem * unit
	}
	if pctSet {
		if pct < 1 || pct > 100 {
			errs = append(errs, fmt.Errorf("%s: %d must be between 1 and 100", n.MemoryPercentage, pct))
		}
		s.MemoryPercent = pct
	}
	if coresSet {
		if cores < 1 || cores > 100 {
			errs = append(errs, fmt.Errorf("%s: %d must be between 1 and 100 (percent of one GPU)", n.Cores, cores))
		}
		s.Cores = cores
	}
	return s, true, errors.Join(errs...)
}

// withPriority adds HAMi's task priority to what a container asks for
// (ok). A priority is refused outside 0 and 1, and without a GPU: it asks
// for no device, and left alone it would stay on the pod as an extended
// resource no node has, so the pod would never be scheduled.
func (t *Translator) withPriority(s Shape, ok bool, prio int64) (Shape, bool, error) {
	name := t.Config.NVIDIA.Priority
	if prio != v1alpha1.PriorityHigh && prio != v1alpha1.PriorityLow {
		return Shape{}, false, fmt.Errorf("%s: %d must be 0 (high) or 1 (low)", name, prio)
	}
	if !ok {
		n := t.Config.NVIDIA
		return Shape{}, false, fmt.Errorf("%s: %d without a GPU (%s, %s, %s or %s): a task priority orders GPU work, so ask for a GPU or drop it", name, prio, n.GPU, n.Memory, n.MemoryPercentage, n.Cores)
	}
	s.Priority, s.HasPriority = int(prio), true
	s.From += fmt.Sprintf(", %s: %d", name, prio)
	return s, true, nil
}

// priorityName is how the translation's summary names a priority.
func priorityName(p int) string {
	if p == v1alpha1.PriorityHigh {
		return "priority 0 (high)"
	}
	return "priority 1 (low)"
}

// priorityConfig is the opaque config a translated template carries for a
// task priority: a GpuConfig with sharing.priority alone, so the claim
// keeps its class's every other setting.
func priorityConfig(prio int) v1alpha1.GpuConfig {
	c := v1alpha1.GpuConfig{Sharing: &v1alpha1.SharingConfig{Priority: &prio}}
	c.APIVersion, c.Kind = v1alpha1.APIVersion, v1alpha1.Kind
	return c
}

func (t *Translator) tencent(cores int64, coresSet bool, mem int64, memSet bool) (Shape, bool, error) {
	n := t.Config.Tencent
	from := fmt.Sprintf("%s: %d", n.Cores, cores)
	if memSet {
		from += fmt.Sprintf(", %s: %d", n.Memory, mem)
	}
	switch {
	case !coresSet && !memSet:
		return Shape{}, false, nil
	case !coresSet:
		return Shape{}, false, fmt.Errorf("%s: %d without %s: gpu-manager needs both", n.Memory, mem, n.Cores)
	case cores == 0 && memSet:
		return Shape{}, false, fmt.Errorf("%s: 0 with %s: %d: a share needs cores", n.Cores, n.Memory, mem)
	case cores == 0:
		return Shape{}, false, nil
	case cores%100 == 0:
		// gpu-manager gives whole GPUs for multiples of 100 and their
		// memory with them; vcuda-memory does not limit them.
		return Shape{Count: cores / 100, From: from}, true, nil
	case cores > 100:
		return Shape{}, false, fmt.Errorf("%s: %d: above 100 it must be a multiple of 100 (whole GPUs)", n.Cores, cores)
	}
	s := Shape{Count: 1, Share: true, Cores: cores, From: from}
	if memSet {
		if mem <= 0 {
			return Shape{}, false, fmt.Errorf("%s: %d must be positive", n.Memory, mem)
		}
		unit := n.MemoryUnit.Value()
		if mem > (1<<62)/unit {
			return Shape{}, false, fmt.Errorf("%s: %d is too large", n.Memory, mem)
		}
		s.Memory = mem * unit
	}
	return s, true, nil
}

// checkInventory refuses a share larger than every known GPU, and a
// memory percentage while no GPU size is known (it is turned into one
// alternative per size).
func (t *Translator) checkInventory(s Shape) error {
	var sizes []int64
	if t.Inventory != nil {
		sizes = t.Inventory.MemorySizes()
	}
	if s.MemoryPercent > 0 && len(sizes) == 0 {
		return fmt.Errorf("%s needs the GPUs' memory sizes and no gpulink GPU is published yet; retry once the kubelet plugin runs", s.From)
	}
	if s.MemoryPercent > 0 && len(sizes) > resourceapi.FirstAvailableDeviceRequestMaxSize {
		// A percentage becomes one firstAvailable alternative per memory
		// size, and a request may have at most 8 of them.
		names := make([]string, len(sizes))
		for i, size := range sizes {
			names[i] = resource.NewQuantity(size, resource.BinarySI).String()
		}
		return fmt.Errorf("%s: the cluster's GPUs come in %d memory sizes (%s) and a claim can offer at most %d (one firstAvailable alternative per size, since DRA capacity requests are absolute); ask for memory in MiB (nvidia.com/gpumem) instead",
			s.From, len(sizes), strings.Join(names, ", "), resourceapi.FirstAvailableDeviceRequestMaxSize)
	}
	if s.Memory > 0 && len(sizes) > 0 && s.Memory > sizes[len(sizes)-1] {
		return fmt.Errorf("%s: %s per GPU is more than any GPU has (largest %s)", s.From,
			resource.NewQuantity(s.Memory, resource.BinarySI).String(), resource.NewQuantity(sizes[len(sizes)-1], resource.BinarySI).String())
	}
	return nil
}

// template is the claim template for a shape: whole GPUs from the whole
// class, shares from the share class with capacity requests. A memory
// percentage becomes one firstAvailable alternative per GPU memory size
// (DRA capacity requests are absolute), smallest GPUs first so the large
// ones stay free.
func (t *Translator) template(s Shape, selectors []string) (resourceapi.ResourceClaimTemplateSpec, error) {
	sels := make([]resourceapi.DeviceSelector, 0, len(selectors))
	for _, e := range selectors {
		sels = append(sels, resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: e}})
	}
	req := resourceapi.DeviceRequest{Name: RequestName}
	var more []resourceapi.DeviceRequest
	switch {
	case s.MIG != "":
		// One request per profile: "gpu", then "gpu-1", "gpu-2", ...
		for i, p := range migProfiles(s.MIG) {
			r := resourceapi.DeviceRequest{Name: migRequestName(i), Exactly: &resourceapi.ExactDeviceRequest{
				DeviceClassName: t.Config.MIGClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: p.count,
				Selectors: append(slices.Clone(sels), resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{Expression: MIGProfileSelector(p.profile)}}),
			}}
			if i == 0 {
				req = r
			} else {
				more = append(more, r)
			}
		}
	case !s.Share:
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: t.Config.WholeClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: s.Count, Selectors: sels}
	case s.MemoryPercent > 0:
		for i, size := range t.Inventory.MemorySizes() {
			mem := percentOfMemory(size, s.MemoryPercent)
			sub := resourceapi.DeviceSubRequest{
				Name:            "m" + strconv.Itoa(i),
				DeviceClassName: t.Config.ShareClass,
				AllocationMode:  resourceapi.DeviceAllocationModeExactCount,
				Count:           s.Count,
				Selectors: append(slices.Clone(sels), resourceapi.DeviceSelector{CEL: &resourceapi.CELDeviceSelector{
					Expression: fmt.Sprintf(`device.capacity[%q].%s.compareTo(quantity(%q)) == 0`, driver.Name, driver.CapacityMemory, strconv.FormatInt(size, 10)),
				}}),
				Capacity: capacity(mem, s.Cores),
			}
			req.FirstAvailable = append(req.FirstAvailable, sub)
		}
	default:
		req.Exactly = &resourceapi.ExactDeviceRequest{DeviceClassName: t.Config.ShareClass, AllocationMode: resourceapi.DeviceAllocationModeExactCount, Count: s.Count, Selectors: sels, Capacity: capacity(s.Memory, s.Cores)}
	}
	spec := resourceapi.ResourceClaimTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{LabelManaged: "true"}},
		Spec:       resourceapi.ResourceClaimSpec{Devices: resourceapi.DeviceClaim{Requests: append([]resourceapi.DeviceRequest{req}, more...)}},
	}
	if s.HasPriority {
		raw, err := json.Marshal(priorityConfig(s.Priority))
		if err != nil {
			return resourceapi.ResourceClaimTemplateSpec{}, fmt.Errorf("encoding the priority config: %w", err)
		}
		spec.Spec.Devices.Config = []resourceapi.DeviceClaimConfiguration{{
			Requests: []string{RequestName},
			DeviceConfiguration: resourceapi.DeviceConfiguration{Opaque: &resourceapi.OpaqueDeviceConfiguration{
				Driver: driver.Name, Parameters: runtime.RawExtension{Raw: raw},
			}},
		}}
	}
	return spec, nil
}

// percentOfMemory is pct percent of a GPU's memory, rounded down to whole
// MiB (the share class's memory step): shares are counted in whole MiB,
// and rounding each up would make shares whose percentages add up to 100
// exceed the GPU (40 % + 60 % of 48 GiB: 19661 + 29492 MiB > 49152 MiB),
// where HAMi puts them on one GPU. Rounded down, they add up to at most
// the GPU's memory.
func percentOfMemory(size, pct int64) int64 {
	const mib = 1 << 20
	mem := size / mib * pct / 100 * mib
	return max(mem, mib)
}

func capacity(mem, cores int64) *resourceapi.CapacityRequirements {
	if mem == 0 && cores == 0 {
		return nil
	}
	r := map[resourceapi.QualifiedName]resource.Quantity{}
	if mem > 0 {
		r[driver.CapacityMemory] = *resource.NewQuantity(mem, resource.BinarySI)
	}
	if cores > 0 {
		r[driver.CapacityCores] = *resource.NewQuantity(cores, resource.DecimalSI)
	}
	return &resourceapi.CapacityRequirements{Requests: r}
}

// migProfileName is what a MIG resource may name after its prefix: the
// profile as nvidia-smi names it, "<n>g.<m>gb", with a compute-instance
// prefix "<n>c." and the suffix "-me" where nvidia-smi has them. Profiles
// whose names carry "+" (+me, +gfx) cannot be resource names.
var migProfileName = regexp.MustCompile(`^([1-7]c\.)?[1-8]g\.[1-9][0-9]{0,3}gb(-me)?$`)

// migShape reads a container's MIG resources (MIGPrefix<profile>: N);
// ok is false when it has none (or only zero counts). Bad profile names
// and values are errors naming the resource and the value.
func (t *Translator) migShape(c *corev1.Container) (Shape, bool, error) {
	names := map[corev1.ResourceName]bool{}
	for _, l := range []corev1.ResourceList{c.Resources.Limits, c.Resources.Requests} {
		for n := range l {
			if t.isMIGName(n) {
				names[n] = true
			}
		}
	}
	var errs []error
	var parts, from []string
	var total int64
	for _, n := range slices.Sorted(maps.Keys(names)) {
		v, _, err := value(&c.Resources, string(n))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		profile := strings.TrimPrefix(string(n), t.Config.NVIDIA.MIGPrefix)
		if !migProfileName.MatchString(profile) {
			errs = append(errs, fmt.Errorf("%s: %d: %q is not a MIG profile name (want <compute slices>g.<memory>gb as nvidia-smi names it, e.g. %s1g.10gb, optionally <n>c. before it or -me after it)",
				n, v, profile, t.Config.NVIDIA.MIGPrefix))
			continue
		}
		if v == 0 {
			continue
		}
		if v > maxMIGDevices {
			errs = append(errs, fmt.Errorf("%s: %d is more MIG devices than one request may ask for (at most %d)", n, v, maxMIGDevices))
			continue
		}
		parts = append(parts, profile+"="+strconv.FormatInt(v, 10))
		from = append(from, fmt.Sprintf("%s: %d", n, v))
		total += v
	}
	if err := errors.Join(errs...); err != nil {
		return Shape{}, false, err
	}
	if len(parts) == 0 {
		return Shape{}, false, nil
	}
	return Shape{Count: total, MIG: strings.Join(parts, ","), From: strings.Join(from, ", ")}, true, nil
}

// maxMIGDevices bounds one resource's count as the controller bounds a
// request's: refused here, the pod is not created to wait forever.
const maxMIGDevices = topology.MaxGPUs

type migProfileCount struct {
	profile string
	count   int64
}

// migProfiles decodes Shape.MIG.
func migProfiles(enc string) []migProfileCount {
	var out []migProfileCount
	for _, part := range strings.Split(enc, ",") {
		p, n, _ := strings.Cut(part, "=")
		c, _ := strconv.ParseInt(n, 10, 64)
		out = append(out, migProfileCount{profile: p, count: c})
	}
	return out
}

// migRequestName names the i-th request of a MIG template.
func migRequestName(i int) string {
	if i == 0 {
		return RequestName
	}
	return RequestName + "-" + strconv.Itoa(i)
}

// MIGProfileSelector is the CEL selector of a translated MIG request.
func MIGProfileSelector(profile string) string {
	return fmt.Sprintf(`device.attributes[%q].%s == %q`, driver.Name, driver.AttrMIGProfile, profile)
}
