package admission

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	corelisters "k8s.io/client-go/listers/core/v1"
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
	// Classes are the DeviceClasses no quota of the namespace limits.
	Classes []string
}

func (e *QuotaError) Error() string {
	entries := make([]string, len(e.Classes))
	for i, c := range e.Classes {
		entries[i] = fmt.Sprintf("%s: %s", classQuotaName(c), e.Limit)
	}
	return fmt.Sprintf("namespace %s has ResourceQuota %s with %s: %s, but the translation takes that resource off the pod and gives it GPUs through ResourceClaims of DeviceClass %s, which no ResourceQuota of the namespace limits (a quota without scopes on %s), so the quota would not count them; "+
		"the cluster operator must move the quota over to the DeviceClass, e.g. add %s to a ResourceQuota of namespace %s (gpulink README, \"Coming from the device plugin\"), or the pod must ask for GPUs through a ResourceClaim",
		e.Namespace, e.Quota, e.Resource, e.Limit, strings.Join(e.Classes, ", "), strings.Join(classQuotaNames(e.Classes), ", "),
		strings.Join(entries, ", "), e.Namespace)
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
// ResourceQuota (QuotaError). It reads quotas from an informer's lister:
// a quota created a moment before a pod may not be seen yet.
type QuotaGuard struct {
	Lister corelisters.ResourceQuotaLister
	// Names are the resource names the translation takes off pods, and
	// Prefixes the prefixes of those it takes by prefix (nvidia.com/mig-).
	Names    []corev1.ResourceName
	Prefixes []string
}

// Check returns a *QuotaError when namespace has a quota on one of the
// translated names and some of classes is limited by no quota there.
func (g *QuotaGuard) Check(namespace string, classes []string) error {
	quotas, err := g.Lister.ResourceQuotas(namespace).List(labels.Everything())
	if err != nil {
		return fmt.Errorf("listing the ResourceQuotas of namespace %s: %w", namespace, err)
	}
	return checkQuotas(namespace, quotas, g.Names, g.Prefixes, classes)
}

// checkQuotas is Check on a given list of quotas.
func checkQuotas(namespace string, quotas []*corev1.ResourceQuota, names []corev1.ResourceName, prefixes []string, classes []string) error {
	quotas = slices.Clone(quotas)
	sort.Slice(quotas, func(i, j int) bool { return quotas[i].Name < quotas[j].Name })
	var limiting *QuotaError
	for _, q := range quotas {
		if limiting != nil {
			break
		}
		for _, n := range names {
			// Quota knows extended resources as requests.<name>; limits.<name>
			// and the bare name are checked too, in case an API server
			// accepts them.
			for _, key := range []corev1.ResourceName{corev1.DefaultResourceRequestsPrefix + n, "limits." + n, n} {
				if v, ok := q.Spec.Hard[key]; ok {
					limiting = &QuotaError{Namespace: namespace, Quota: q.Name, Resource: string(key), Limit: v.String()}
					break
				}
			}
			if limiting != nil {
				break
			}
		}
		// A quota on one MIG profile (requests.nvidia.com/mig-1g.10gb)
		// limits a name the translation takes too.
		for _, key := range slices.Sorted(maps.Keys(q.Spec.Hard)) {
			if limiting != nil {
				break
			}
			bare := strings.TrimPrefix(strings.TrimPrefix(string(key), corev1.DefaultResourceRequestsPrefix), "limits.")
			for _, p := range prefixes {
				if strings.HasPrefix(bare, p) {
					v := q.Spec.Hard[key]
					limiting = &QuotaError{Namespace: namespace, Quota: q.Name, Resource: string(key), Limit: v.String()}
					break
				}
			}
		}
	}
	if limiting == nil {
		return nil
	}
	for _, c := range classes {
		if !classLimited(quotas, c) {
			limiting.Classes = append(limiting.Classes, c)
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

// isQuotaError says whether err is a QuotaError.
func isQuotaError(err error) bool {
	var qe *QuotaError
	return errors.As(err, &qe)
}
