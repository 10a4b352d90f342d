package planner

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/dynamic-resource-allocation/resourceclaim"

	"github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

// ClaimKind says who allocates a claim.
type ClaimKind int

const (
	// claimForeign: no request selects gpulink devices; kube-scheduler
	// allocates it.
	claimForeign ClaimKind = iota
	// claimOurs: every request selects gpulink devices; the controller
	// allocates it, whether or not the requests tolerate gpulink's
	// managed taint: one allocator for every gpulink device, so that no
	// two decisions can pick the same GPU unseen by each other.
	ClaimOurs
)

// interpretedClaim is a gpulink claim in the controller's terms.
type Claim struct {
	Claim       *resourceapi.ResourceClaim
	Requests    []*RequestSpec
	Constraints []matchConstraint
	// Foreign are the requests for other drivers' devices that the claim
	// asks for together with gpulink's (foreign_claims.go).
	Foreign []*ForeignRequest
	// Tolerating is set when every request tolerates the managed taint,
	// so kube-scheduler's allocator may take the claim too: the
	// controller allocates it for gated pods only (see syncPod).
	Tolerating bool
}

// RequestSpec is one request with its alternatives: one for `exactly`,
// several for `firstAvailable`, tried in order.
type RequestSpec struct {
	Name         string
	Alternatives []*Alternative
}

// Alternative is one concrete way to satisfy a request.
type Alternative struct {
	// ResultName is the request name results carry: "req" or "req/sub".
	ResultName string
	// Rank is the position in firstAvailable (0 for exactly).
	Rank  int
	Class *resourceapi.DeviceClass
	// Selectors are the class's CEL expressions, then the request's.
	Selectors []string
	// All is allocationMode All; otherwise Count devices are wanted.
	All   bool
	Count int
	// Share: one share of Count distinct GPUs each.
	Share bool
	// MIG: Count MIG devices (or all matching ones), each exclusively,
	// drawn from the nodes' MIG devices only (nodeplan_mig.go).
	MIG bool
	// Capacity holds requested capacities by fully qualified name.
	Capacity map[resourceapi.FullyQualifiedName]resource.Quantity
	// Config is the effective (merged, defaulted, validated) config.
	Config *v1alpha1.GpuConfig
	// ConfigMemory and ConfigCores are share sizes a config layer set
	// explicitly; they apply when the request asks for no such capacity.
	ConfigMemory *resource.Quantity
	ConfigCores  *int64
	RequiredLink topology.Link
	Tolerations  []resourceapi.DeviceToleration
	// ShareGroup is the sharing group of a share (allocate.ShareRequest.Group):
	// concurrentGroup(namespace) for a concurrent MPS share, "" otherwise.
	ShareGroup string
	// shareSig identifies what a share asks for, to memoise per-device
	// consumption on node inventories.
	shareSig string
}

// shareSignature renders the inputs of shareConsumption.
func shareSignature(a *Alternative) string {
	names := make([]string, 0, len(a.Capacity))
	for n := range a.Capacity {
		names = append(names, string(n))
	}
	slices.Sort(names)
	var b strings.Builder
	for _, n := range names {
		q := a.Capacity[resourceapi.FullyQualifiedName(n)]
		b.WriteString(n + "=" + q.String() + ";")
	}
	if a.ConfigMemory != nil {
		b.WriteString("cfgmem=" + a.ConfigMemory.String() + ";")
	}
	if a.ConfigCores != nil {
		b.WriteString("cfgcores=" + strconv.FormatInt(*a.ConfigCores, 10) + ";")
	}
	if a.Config != nil && a.Config.Sharing != nil && a.Config.Sharing.DefaultCores != nil {
		b.WriteString("dfltcores=" + strconv.FormatInt(*a.Config.Sharing.DefaultCores, 10) + ";")
	}
	if a.ShareGroup != "" {
		b.WriteString("group=" + a.ShareGroup)
	}
	return b.String()
}

// ConcurrentGroup is the sharing group of the concurrent MPS shares of a
// namespace: they share one MPS server per GPU (sharing.mpsMode
// Concurrent), so no share of another namespace, and no share of another
// kind, may join their GPU.
func ConcurrentGroup(namespace string) string { return "mps-concurrent/" + namespace }

// matchConstraint is a matchAttribute constraint over some requests.
type matchConstraint struct {
	Attr resourceapi.FullyQualifiedName
	// Requests it applies to; empty means all requests of the claim.
	Requests []string
}

// appliesTo tells whether the constraint covers a result request name.
func (m matchConstraint) appliesTo(resultName string) bool {
	if len(m.Requests) == 0 {
		return true
	}
	base := resourceclaim.BaseRequestRef(resultName)
	return slices.Contains(m.Requests, base) || slices.Contains(m.Requests, resultName)
}

// uninterpretableError is a claim the controller will not allocate because
// it cannot honour some part of it exactly. The message names the field.
type uninterpretableError struct {
	claim string
	Err   error
}

func (e *uninterpretableError) Error() string {
	return fmt.Sprintf("claim %s cannot be allocated by gpulink: %v", e.claim, e.Err)
}
func (e *uninterpretableError) Unwrap() error { return e.Err }

// errClassMissing wraps a missing DeviceClass: the claim may become
// interpretable once the class is created.
var ErrClassMissing = errors.New("DeviceClass not found")

var managedTaint = resourceapi.DeviceTaint{Key: driver.ManagedTaintKey, Effect: resourceapi.DeviceTaintEffectNoSchedule}

// Interpreter turns claims into allocation problems.
type Interpreter struct {
	classes ClassGetter
	cel     *SelectorEvaluator
	inv     *Inventory

	// configs caches resolved configuration layers: claims of one
	// template carry identical layers, and decoding them is the costliest
	// part of interpreting a claim.
	configMu sync.Mutex
	configs  map[string]*resolvedConfig
}

// ClassGetter reads DeviceClasses by name; a DeviceClass lister is one.
type ClassGetter interface {
	Get(name string) (*resourceapi.DeviceClass, error)
}

// NewInterpreter interprets claims with the classes, the selector
// evaluator and the inventory of nodes (for what a class selects).
func NewInterpreter(classes ClassGetter, sel *SelectorEvaluator, inv *Inventory) *Interpreter {
	return &Interpreter{classes: classes, cel: sel, inv: inv}
}

type resolvedConfig struct {
	cfg   *v1alpha1.GpuConfig
	mem   *resource.Quantity
	cores *int64
	err   error
}

// maxConfigCache bounds the config cache; it is simply reset when full.
const maxConfigCache = 4096

// resolve decodes, checks, merges, defaults and validates the configuration
// layers of a request (the DeviceClass's, then the claim's), and reports
// the share sizes the layers set explicitly.
func (ip *Interpreter) resolve(class, claim [][]byte) *resolvedConfig {
	var key strings.Builder
	// Which layers are the class's is part of the key: the same bytes
	// may be allowed from a class and refused from a claim.
	key.WriteString(strconv.Itoa(len(class)))
	key.WriteByte('/')
	for _, l := range slices.Concat(class, claim) {
		key.WriteString(strconv.Itoa(len(l)))
		key.WriteByte(':')
		key.Write(l)
	}
	k := key.String()
	ip.configMu.Lock()
	if r, ok := ip.configs[k]; ok {
		ip.configMu.Unlock()
		return r
	}
	ip.configMu.Unlock()
	r := &resolvedConfig{}
	r.cfg, r.mem, r.cores, r.err = resolveLayers(class, claim)
	ip.configMu.Lock()
	if ip.configs == nil || len(ip.configs) >= maxConfigCache {
		ip.configs = map[string]*resolvedConfig{}
	}
	ip.configs[k] = r
	ip.configMu.Unlock()
	return r
}

// resolveLayers decodes each configuration layer once and resolves them,
// returning the effective config and the share size the layers set
// explicitly (nil where they leave it to the device's default). The
// claim's layers may only narrow what the class's allow (see
// v1alpha1.CheckClaimNarrows); the kubelet plugin applies the same rule.
func resolveLayers(class, claim [][]byte) (*v1alpha1.GpuConfig, *resource.Quantity, *int64, error) {
	decodedClass, err := v1alpha1.DecodeLayers(class...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("DeviceClass configuration: %w", err)
	}
	decodedClaim, err := v1alpha1.DecodeLayers(claim...)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("claim configuration: %w", err)
	}
	cfg, explicit, err := v1alpha1.ResolveDecoded(decodedClass, decodedClaim)
	if err != nil {
		return nil, nil, nil, err
	}
	if explicit.Sharing == nil {
		return cfg, nil, nil, nil
	}
	return cfg, explicit.Sharing.DefaultMemory, explicit.Sharing.DefaultCores, nil
}

// Interpret classifies a claim and, for gpulink claims, builds its
// requests. Errors are *uninterpretableError, or wrap errClassMissing.
func (ip *Interpreter) Interpret(ctx context.Context, claim *resourceapi.ResourceClaim) (*Claim, ClaimKind, error) {
	key := claim.Namespace + "/" + claim.Name
	fail := func(err error) (*Claim, ClaimKind, error) {
		return nil, ClaimOurs, &uninterpretableError{claim: key, Err: err}
	}
	spec := claim.Spec.Devices
	reqPath := field.NewPath("spec", "devices", "requests")
	out := &Claim{Claim: claim}
	var ours, foreign []string
	var foreignSubs []foreignPending
	for i := range spec.Requests {
		r := &spec.Requests[i]
		path := reqPath.Index(i)
		rs := &RequestSpec{Name: r.Name}
		var subs []subRequest
		switch {
		case r.Exactly != nil && len(r.FirstAvailable) == 0:
			e := r.Exactly
			subs = append(subs, subRequest{resultName: r.Name, path: path.Child("exactly"), class: e.DeviceClassName,
				selectors: e.Selectors, mode: e.AllocationMode, count: e.Count, adminAccess: e.AdminAccess,
				tolerations: e.Tolerations, capacity: e.Capacity, derived: len(e.DerivedAttributes)})
		case r.Exactly == nil && len(r.FirstAvailable) > 0:
			for j := range r.FirstAvailable {
				s := &r.FirstAvailable[j]
				subs = append(subs, subRequest{resultName: resourceclaim.CreateSubRequestRef(r.Name, s.Name), path: path.Child("firstAvailable").Index(j),
					class: s.DeviceClassName, selectors: s.Selectors, mode: s.AllocationMode, count: s.Count,
					tolerations: s.Tolerations, capacity: s.Capacity, derived: len(s.DerivedAttributes)})
			}
		default:
			return fail(field.Invalid(path, r.Name, "exactly one of exactly or firstAvailable must be set"))
		}
		var reqOurs, reqForeign int
		fp := foreignPending{path: path, firstAvailable: r.Exactly == nil}
		for rank, s := range subs {
			class, err := ip.classes.Get(s.class)
			if err != nil {
				return nil, ClaimOurs, fmt.Errorf("claim %s, %s: DeviceClass %q: %w", key, s.path.Child("deviceClassName"), s.class, ErrClassMissing)
			}
			isOurs, err := ip.cel.ClassSelectsGpulink(ctx, class, ip.inv)
			if err != nil {
				return fail(fmt.Errorf("%s: %w", s.path.Child("deviceClassName"), err))
			}
			if !isOurs {
				reqForeign++
				fp.subs, fp.classes = append(fp.subs, s), append(fp.classes, class)
				continue
			}
			reqOurs++
			alt, err := ip.alternative(claim, class, s, rank)
			if err != nil {
				return fail(err)
			}
			rs.Alternatives = append(rs.Alternatives, alt)
		}
		switch {
		case reqOurs == len(subs):
			ours = append(ours, r.Name)
			out.Requests = append(out.Requests, rs)
		case reqForeign == len(subs):
			foreign = append(foreign, r.Name)
			foreignSubs = append(foreignSubs, fp)
		default:
			return fail(field.Invalid(path, r.Name, "its firstAvailable alternatives mix gpulink device classes with other drivers' classes; gpulink cannot weigh alternatives it does not allocate"))
		}
	}
	switch {
	case len(ours) == 0:
		return nil, claimForeign, nil
	case len(foreign) > 0:
		if err := ip.foreignRequests(out, foreignSubs); err != nil {
			return fail(err)
		}
	}
	if err := checkMPSModes(out); err != nil {
		return fail(err)
	}
	out.Tolerating = true
	for _, rs := range out.Requests {
		for _, alt := range rs.Alternatives {
			if !tolerates(alt.Tolerations, managedTaint) {
				out.Tolerating = false
			}
		}
	}
	consPath := field.NewPath("spec", "devices", "constraints")
	for i, c := range spec.Constraints {
		switch {
		case c.DistinctAttribute != nil:
			return fail(field.NotSupported(consPath.Index(i).Child("distinctAttribute"), string(*c.DistinctAttribute), []string{"matchAttribute"}))
		case c.MatchAttribute != nil:
			out.Constraints = append(out.Constraints, matchConstraint{Attr: qualify(string(*c.MatchAttribute), driver.Name), Requests: c.Requests})
		default:
			return fail(field.Required(consPath.Index(i), "a constraint needs matchAttribute"))
		}
	}
	return out, ClaimOurs, nil
}

// subRequest unifies exactly and firstAvailable entries.
type subRequest struct {
	resultName  string
	path        *field.Path
	class       string
	selectors   []resourceapi.DeviceSelector
	mode        resourceapi.DeviceAllocationMode
	count       int64
	adminAccess *bool
	tolerations []resourceapi.DeviceToleration
	capacity    *resourceapi.CapacityRequirements
	derived     int
}

func (ip *Interpreter) alternative(claim *resourceapi.ResourceClaim, class *resourceapi.DeviceClass, s subRequest, rank int) (*Alternative, error) {
	alt := &Alternative{ResultName: s.resultName, Rank: rank, Class: class, Tolerations: s.tolerations}
	if s.adminAccess != nil && *s.adminAccess {
		return nil, field.Forbidden(s.path.Child("adminAccess"), "gpulink does not grant admin access to GPUs")
	}
	if s.derived > 0 {
		return nil, field.Forbidden(s.path.Child("derivedAttributes"), "derived attributes (alpha) are not supported by gpulink")
	}
	for _, sel := range class.Spec.Selectors {
		alt.Selectors = append(alt.Selectors, sel.CEL.Expression)
	}
	for i, sel := range s.selectors {
		if sel.CEL == nil {
			return nil, field.Required(s.path.Child("selectors").Index(i).Child("cel"), "gpulink understands CEL selectors only")
		}
		if _, err := ip.cel.compile(sel.CEL.Expression); err != nil {
			return nil, field.Invalid(s.path.Child("selectors").Index(i).Child("cel", "expression"), sel.CEL.Expression, err.Error())
		}
		alt.Selectors = append(alt.Selectors, sel.CEL.Expression)
	}
	switch s.mode {
	case "", resourceapi.DeviceAllocationModeExactCount:
		alt.Count = int(s.count)
		if alt.Count == 0 {
			alt.Count = 1
		}
		if alt.Count < 0 || alt.Count > topology.MaxGPUs {
			return nil, field.Invalid(s.path.Child("count"), s.count, fmt.Sprintf("must be between 1 and %d", topology.MaxGPUs))
		}
	case resourceapi.DeviceAllocationModeAll:
		alt.All = true
	default:
		return nil, field.NotSupported(s.path.Child("allocationMode"), s.mode,
			[]resourceapi.DeviceAllocationMode{resourceapi.DeviceAllocationModeExactCount, resourceapi.DeviceAllocationModeAll})
	}
	for i, t := range s.tolerations {
		if t.Operator != "" && t.Operator != resourceapi.DeviceTolerationOpExists && t.Operator != resourceapi.DeviceTolerationOpEqual {
			return nil, field.NotSupported(s.path.Child("tolerations").Index(i).Child("operator"), t.Operator,
				[]resourceapi.DeviceTolerationOperator{resourceapi.DeviceTolerationOpExists, resourceapi.DeviceTolerationOpEqual})
		}
	}
	if s.capacity != nil && len(s.capacity.Requests) > 0 {
		alt.Capacity = map[resourceapi.FullyQualifiedName]resource.Quantity{}
		for name, q := range s.capacity.Requests {
			fq := qualify(string(name), driver.Name)
			if fq != capMemory && fq != capCores {
				return nil, field.NotSupported(s.path.Child("capacity", "requests").Key(string(name)), string(name), []string{driver.CapacityMemory, driver.CapacityCores})
			}
			if q.Sign() <= 0 {
				return nil, field.Invalid(s.path.Child("capacity", "requests").Key(string(name)), q.String(), "must be positive")
			}
			alt.Capacity[fq] = q
		}
	}
	if IsMIGClass(class) {
		// A MIG device is a fixed slice of a GPU given out whole: there
		// is no capacity to consume from it, and no way to share it.
		if len(alt.Capacity) > 0 {
			return nil, field.Forbidden(s.path.Child("capacity", "requests"), fmt.Sprintf("DeviceClass %s gives out MIG devices, each whole; select a profile (device.attributes[%q].%s) or a minimum memory (device.capacity[%q].%s) with a CEL selector instead",
				class.Name, driver.Name, driver.AttrMIGProfile, driver.Name, driver.CapacityMemory))
		}
		if isShareClass(class) {
			return nil, field.Invalid(s.path.Child("deviceClassName"), class.Name, fmt.Sprintf("the DeviceClass carries both %s=true and %s=true; MIG devices cannot be shared", MIGLabel, SharingLabel))
		}
		alt.MIG = true
	}
	alt.Share = isShareClass(class) || len(alt.Capacity) > 0
	if alt.Share && alt.All {
		return nil, field.Invalid(s.path.Child("allocationMode"), s.mode, "allocationMode All cannot be combined with a share (share class or capacity requests)")
	}

	// Configuration layers: the class's, then the claim's entries that
	// name this request (or its parent), in order.
	var classLayers, claimLayers [][]byte
	for _, c := range class.Spec.Config {
		if c.Opaque != nil && c.Opaque.Driver == driver.Name {
			classLayers = append(classLayers, c.Opaque.Parameters.Raw)
		}
	}
	base := resourceclaim.BaseRequestRef(s.resultName)
	for i, c := range claim.Spec.Devices.Config {
		if c.Opaque == nil || c.Opaque.Driver != driver.Name {
			continue
		}
		if len(c.Requests) > 0 && !slices.Contains(c.Requests, base) && !slices.Contains(c.Requests, s.resultName) {
			continue
		}
		if len(c.Opaque.Parameters.Raw) == 0 {
			return nil, field.Required(field.NewPath("spec", "devices", "config").Index(i).Child("opaque", "parameters"), "")
		}
		claimLayers = append(claimLayers, c.Opaque.Parameters.Raw)
	}
	rc := ip.resolve(classLayers, claimLayers)
	if rc.err != nil {
		return nil, fmt.Errorf("opaque configuration for request %s: %w", s.resultName, rc.err)
	}
	cfg := rc.cfg
	alt.Config = cfg
	alt.RequiredLink = cfg.RequiredLink()
	alt.ConfigMemory = rc.mem
	alt.ConfigCores = rc.cores
	if alt.Share && cfg.ConcurrentMPS() {
		// The clients of a concurrent share reach one MPS server, which
		// serves one GPU.
		if alt.Count > 1 {
			return nil, field.Invalid(s.path.Child("count"), s.count, fmt.Sprintf("DeviceClass %s sets sharing.mpsMode=%s, whose share is served by one GPU's MPS server; ask for one share per request (or use a class with sharing.mpsMode=%s)",
				class.Name, v1alpha1.MPSConcurrent, v1alpha1.MPSIsolated))
		}
		alt.ShareGroup = ConcurrentGroup(claim.Namespace)
	}
	if alt.Share {
		alt.shareSig = shareSignature(alt)
	}
	if alt.Share && cfg.Sharing != nil && cfg.Sharing.Strategy == v1alpha1.SharingNone {
		return nil, fmt.Errorf("request %s asks for a share but its configuration sets sharing.strategy=%s, which gives out whole GPUs only", s.resultName, v1alpha1.SharingNone)
	}
	return alt, nil
}

// tolerates tells whether any toleration tolerates the taint.
func tolerates(tols []resourceapi.DeviceToleration, taint resourceapi.DeviceTaint) bool {
	for _, t := range tols {
		if resourceclaim.ToleratesTaint(t, taint) {
			return true
		}
	}
	return false
}
