package admission

import (
	"errors"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/gpulink/gpulink/driver"
)

func quota(name, ns string, hard map[string]string) *corev1.ResourceQuota {
	q := &corev1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: corev1.ResourceQuotaSpec{Hard: corev1.ResourceList{}}}
	for k, v := range hard {
		q.Spec.Hard[corev1.ResourceName(k)] = resource.MustParse(v)
	}
	return q
}

func quotaLister(quotas ...*corev1.ResourceQuota) corelisters.ResourceQuotaLister {
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	for _, q := range quotas {
		_ = idx.Add(q)
	}
	return corelisters.NewResourceQuotaLister(idx)
}

func TestCheckQuotas(t *testing.T) {
	names := []corev1.ResourceName{"nvidia.com/gpu", "nvidia.com/gpumem"}
	whole := []string{driver.DeviceClassWhole}
	classQuota := driver.DeviceClassWhole + corev1.ResourceClaimsPerClass
	scoped := quota("scoped", "ns", map[string]string{classQuota: "2"})
	scoped.Spec.Scopes = []corev1.ResourceQuotaScope{corev1.ResourceQuotaScopeNotBestEffort}
	for _, tc := range []struct {
		name    string
		quotas  []*corev1.ResourceQuota
		refused string // the quota resource the refusal names; empty: allowed
	}{
		{"no quota", nil, ""},
		{"quota on other resources", []*corev1.ResourceQuota{quota("q", "ns", map[string]string{"requests.cpu": "1", "pods": "3"})}, ""},
		{"requests. form", []*corev1.ResourceQuota{quota("q", "ns", map[string]string{"requests.nvidia.com/gpu": "1"})}, "requests.nvidia.com/gpu"},
		{"limits. form", []*corev1.ResourceQuota{quota("q", "ns", map[string]string{"limits.nvidia.com/gpu": "1"})}, "limits.nvidia.com/gpu"},
		{"bare name", []*corev1.ResourceQuota{quota("q", "ns", map[string]string{"nvidia.com/gpumem": "1000"})}, "nvidia.com/gpumem"},
		{"class quota in another object", []*corev1.ResourceQuota{
			quota("a", "ns", map[string]string{"requests.nvidia.com/gpu": "1"}), quota("b", "ns", map[string]string{classQuota: "1"})}, ""},
		{"class quota in the same object", []*corev1.ResourceQuota{quota("a", "ns", map[string]string{"requests.nvidia.com/gpu": "1", classQuota: "1"})}, ""},
		// A scoped quota never counts claims (their evaluator matches no scope).
		{"scoped class quota", []*corev1.ResourceQuota{quota("a", "ns", map[string]string{"requests.nvidia.com/gpu": "1"}), scoped}, "requests.nvidia.com/gpu"},
		{"quota of another class", []*corev1.ResourceQuota{quota("a", "ns", map[string]string{"requests.nvidia.com/gpu": "1",
			driver.DeviceClassShare + corev1.ResourceClaimsPerClass: "1"})}, "requests.nvidia.com/gpu"},
		// A MIG profile's name is taken by prefix; a quota on it limits too.
		{"MIG profile by prefix", []*corev1.ResourceQuota{quota("q", "ns", map[string]string{"requests.nvidia.com/mig-1g.10gb": "1"})}, "requests.nvidia.com/mig-1g.10gb"},
		{"other prefix", []*corev1.ResourceQuota{quota("q", "ns", map[string]string{"requests.example.com/mig-1g.10gb": "1"})}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkQuotas(quotaCheck{namespace: "ns", quotas: tc.quotas, names: names, prefixes: []string{"nvidia.com/mig-"}, classes: whole})
			if tc.refused == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			var qe *QuotaError
			if !errors.As(err, &qe) {
				t.Fatalf("want a QuotaError, got %v", err)
			}
			if qe.Resource != tc.refused || len(qe.Classes) != 1 || qe.Classes[0] != driver.DeviceClassWhole {
				t.Errorf("refusal %+v, want resource %s and class %s", qe, tc.refused, driver.DeviceClassWhole)
			}
			if !strings.Contains(err.Error(), classQuota) {
				t.Errorf("message %q does not say what to add (%s)", err, classQuota)
			}
		})
	}
}

func TestQuotaGuardReadsTheNamespace(t *testing.T) {
	g := &QuotaGuard{Lister: quotaLister(quota("gpus", "a", map[string]string{"requests.nvidia.com/gpu": "1"})), Names: []corev1.ResourceName{"nvidia.com/gpu"}}
	spec := []resourceapi.ResourceClaimSpec{{Devices: resourceapi.DeviceClaim{Requests: []resourceapi.DeviceRequest{{Name: "gpu", Exactly: &resourceapi.ExactDeviceRequest{DeviceClassName: driver.DeviceClassWhole}}}}}}
	if err := g.Check("a", spec); !isQuotaError(err) {
		t.Errorf("namespace a: %v", err)
	}
	if err := g.Check("b", spec); err != nil {
		t.Errorf("namespace b: %v", err)
	}
}
