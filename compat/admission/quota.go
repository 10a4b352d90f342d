package admission

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"

	"github.com/gpulink/gpulink/compat"
)

// QuotaError says why a pod is not translated in its namespace: a
// ResourceQuota limits a device-plugin resource name that the translation
// takes off the pod, and no quota limits the DeviceClass the pod's GPUs
// would come from. ResourceQuota is charged after mutating admission, on
// what the pod asks for then; the translated pod asks for no
// nvidia.com/gpu, and its claims are counted only by quotas on
// <class>.deviceclass.resource.k8s.io/devices. Translating there would let
// a namespace capped at 1 GPU get 8.
type QuotaError struct {
	Namespace string
	// Quota and Resource: the quota and its hard entry that limit a
	// translated name, Limit its value.
	Quota, Resource, Limit string
	// CountsDevices says that Resource counts GPUs or MIG devices, so
	// that the class quota to add may have the same value. A memory or
	// core quota's value says nothing about how many devices to allow.
	CountsDevices bool
	// Classes are the DeviceClasses no quota of the namespace limits.
	Classes []string
}

func (e *QuotaError) Error() string {
	value := e.Limit
	if !e.CountsDevices {
		value = "<how many devices of the class the namespace may use>"
	}
	entries := make([]string, len(e.Classes))
	for i, c := range e.Classes {
		entries[i] = fmt.Sprintf("%s: %s", classQuotaName(c), value)
	}
	return fmt.Sprintf("namespace %s has ResourceQuota %s with %s: %s, but the translation takes that resource off the pod and gives it GPUs through ResourceClaims of DeviceClass %s, which no ResourceQuota of the namespace limits (a quota without scopes on %s), so the quota would not count them; "+
		"the cluster operator must move the quota over to the DeviceClass, e.g. add %s to a ResourceQuota of namespace %s (gpulink README, \"Coming from the device plugin\"), or the pod must ask for GPUs through a ResourceClaim",
		e.Namespace, e.Quota, e.Resource, e.Limit, strings.Join(e.Classes, ", "), strings.Join(classQuotaNames(e.Classes), ", "),
		strings.Join(entries, ", "), e.Namespace)
}

// CapacityQuotaError says why a pod asking for GPU memory or cores is not
// translated: its namespace's quota limits that memory or those cores
// (requests.nvidia.com/gpumem: 4096 means 4096 MiB of GPU memory), and no
// quota of Kubernetes 1.37 can count them once they are a ResourceClaim's
// capacity requests: a quota on the share class counts a share as one
// device whatever its size, so a namespace capped at 4096 MiB and 2
// shares would get two 40000 MiB shares. gpulink refuses the pod instead
// of translating it past the quota.
type CapacityQuotaError struct {
	Namespace string
	// Quota and Resource: the quota and its hard entry that limit GPU
	// memory or cores, Limit its value; Capacity what the pod's claims
	// would ask for instead (driver.CapacityMemory or CapacityCores).
	Quota, Resource, Limit, Capacity string
	// WholeClass and ShareClass are the DeviceClasses of whole GPUs and
	// of shares.
	WholeClass, ShareClass string
}

func (e *CapacityQuotaError) Error() string {
	return fmt.Sprintf("namespace %s has ResourceQuota %s with %s: %s, which limits GPU %s; the translation would give this pod its GPU %s as the capacity of a ResourceClaim, "+
		"and Kubernetes ResourceQuota counts a claim's devices, not their %s, so that quota would not hold: gpulink does not translate GPU %s amounts in this namespace. "+
		"Instead, ask for whole GPUs (the GPU count alone, without memory or core amounts), which a quota on %s counts one by one; "+
		"or have the cluster operator leave this namespace to the device plugin and its quota (compat.namespaceSelector). "+
		"A quota on %s would not replace %s: it caps the number of shares, each of which may be as large as a whole GPU",
		e.Namespace, e.Quota, e.Resource, e.Limit, e.Capacity, e.Capacity, e.Capacity, e.Capacity,
		classQuotaName(e.WholeClass), classQuotaName(e.ShareClass), e.Resource)
}

// classQuotaName is the quota resource that counts a DeviceClass's devices
// in ResourceClaims (k8s.io/kubernetes pkg/quota/v1/evaluator/core
// V1ResourceByDeviceClass).
func classQuotaName(class string) string {
	return class + corev1.ResourceClaimsPerClass
}

func classQuotaNames(classes []string) []string {
	out := make([]string, len(classes))
	for i, c := range classes {
		out[i] = classQuotaName(c)
	}
	return out
}

// QuotaGuard refuses translations that would escape a namespace's
// ResourceQuota (QuotaError, CapacityQuotaError). It reads quotas from an
// informer's lister: a quota created a moment before a pod may not be seen
// yet.
type QuotaGuard struct {
	Lister corelisters.ResourceQuotaLister
	// Names are the resource names the translation takes off pods, and
	// Prefixes the prefixes of those it takes by prefix (nvidia.com/mig-).
	Names    []corev1.ResourceName
	Prefixes []string
	// Counting sorts Names by what a quota on them counts; names in
	// neither of its lists (the task priority) are treated as Devices'
	// except that no class quota value is suggested for them.
	Counting compat.QuotaNames
	// WholeClass and ShareClass are the DeviceClasses of whole GPUs and
	// of shares, named in refusals.
	WholeClass, ShareClass string
}

// NewQuotaGuard is the guard of a translator's names.
func NewQuotaGuard(lister corelisters.ResourceQuotaLister, tr *compat.Translator) *QuotaGuard {
	return &QuotaGuard{Lister: lister, Names: tr.ResourceNames(), Prefixes: tr.ResourcePrefixes(), Counting: tr.QuotaNames(), WholeClass: tr.Config.WholeClass, ShareClass: tr.Config.ShareClass}
}

// Check returns a *CapacityQuotaError when namespace has a quota on GPU
// memory or cores and specs ask for that capacity, and a *QuotaError when
// it has a quota on one of the translated names and some DeviceClass of
// specs is limited by no quota there.
func (g *QuotaGuard) Check(namespace string, specs []resourceapi.ResourceClaimSpec) error {
	quotas, err := g.Lister.ResourceQuotas(namespace).List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing the ResourceQuotas of namespace %s: %w", namespace, err)
	}
	var classes []string
	var capacities []resourceapi.QualifiedName
	for _, spec := range specs {
		classes = append(classes, compat.SpecClasses(spec)...)
		capacities = append(capacities, compat.SpecCapacities(spec)...)
	}
	slices.Sort(classes)
	slices.Sort(capacities)
	return checkQuotas(quotaCheck{
		namespace: namespace, quotas: quotas, names: g.Names, prefixes: g.Prefixes, counting: g.Counting, wholeClass: g.WholeClass, shareClass: g.ShareClass,
		classes: slices.Compact(classes), capacities: slices.Compact(capacities),
	})
}

// quotaCheck is what checkQuotas decides on.
type quotaCheck struct {
	namespace  string
	quotas     []*corev1.ResourceQuota
	names      []corev1.ResourceName
	prefixes   []string
	counting   compat.QuotaNames
	wholeClass string
	shareClass string
	// classes and capacities: what the pod's claims ask for.
	classes    []string
	capacities []resourceapi.QualifiedName
}

// quotaKeys are the hard entries that limit an extended resource: quota
// knows extended resources as requests.<name>; limits.<name> and the bare
// name are checked too, in case an API server accepts them.
func quotaKeys(n corev1.ResourceName) []corev1.ResourceName {
	return []corev1.ResourceName{corev1.DefaultResourceRequestsPrefix + n, "limits." + n, n}
}

// checkQuotas is Check on a given list of quotas.
func checkQuotas(c quotaCheck) error {
	quotas := slices.Clone(c.quotas)
	sort.Slice(quotas, func(i, j int) bool { return quotas[i].Name < quotas[j].Name })
	// Memory and cores first: no class quota makes up for them.
	for _, q := range quotas {
		for _, n := range slices.Sorted(maps.Keys(c.counting.Capacities)) {
			capName := c.counting.Capacities[n]
			if !slices.Contains(c.capacities, capName) {
				continue
			}
			for _, key := range quotaKeys(n) {
				if v, ok := q.Spec.Hard[key]; ok {
					return &CapacityQuotaError{Namespace: c.namespace, Quota: q.Name, Resource: string(key), Limit: v.String(), Capacity: string(capName), WholeClass: c.wholeClass, ShareClass: c.shareClass}
				}
			}
		}
	}
	var limiting *QuotaError
	for _, q := range quotas {
		if limiting != nil {
			break
		}
		for _, n := range c.names {
			for _, key := range quotaKeys(n) {
				if v, ok := q.Spec.Hard[key]; ok {
					limiting = &QuotaError{Namespace: c.namespace, Quota: q.Name, Resource: string(key), Limit: v.String(), CountsDevices: slices.Contains(c.counting.Devices, n)}
					break
				}
			}
			if limiting != nil {
				break
			}
		}
		// A quota on one MIG profile (requests.nvidia.com/mig-1g.10gb)
		// limits a name the translation takes too, and counts devices.
		for _, key := range slices.Sorted(maps.Keys(q.Spec.Hard)) {
			if limiting != nil {
				break
			}
			bare := strings.TrimPrefix(strings.TrimPrefix(string(key), corev1.DefaultResourceRequestsPrefix), "limits.")
			for _, p := range c.prefixes {
				if strings.HasPrefix(bare, p) {
					v := q.Spec.Hard[key]
					limiting = &QuotaError{Namespace: c.namespace, Quota: q.Name, Resource: string(key), Limit: v.String(), CountsDevices: true}
					break
				}
			}
		}
	}
	if limiting == nil {
		return nil
	}
	for _, cl := range c.classes {
		if !classLimited(quotas, cl) {
			limiting.Classes = append(limiting.Classes, cl)
		}
	}
	if len(limiting.Classes) == 0 {
		return nil
	}
	return limiting
}

// classLimited says whether a quota counts the devices of class in claims.
// Only quotas without scopes do: the ResourceClaim quota evaluator matches
// no scope (MatchesNoScopeFunc), so a scoped quota never counts a claim.
func classLimited(quotas []*corev1.ResourceQuota, class string) bool {
	key := corev1.ResourceName(classQuotaName(class))
	for _, q := range quotas {
		if len(q.Spec.Scopes) > 0 || q.Spec.ScopeSelector != nil {
			continue
		}
		if _, ok := q.Spec.Hard[key]; ok {
			return true
		}
	}
	return false
}

// isQuotaError says whether err is a QuotaError or a CapacityQuotaError.
func isQuotaError(err error) bool {
	var qe *QuotaError
	var ce *CapacityQuotaError
	return errors.As(err, &qe) || errors.As(err, &ce)
}
