package controllertest

import (
	"context"
	"fmt"
	"sort"
	"strings"

	resourceapi "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/gpulink/gpulink/driver"
)

// CheckInvariants checks the allocations of all claims against the
// published devices: no device (gpulink's or another driver's) is given
// out whole twice, a device given out whole holds no share, the consumed
// capacity of a device's shares never exceeds what it publishes, every
// allocated gpulink device exists, a claim's gpulink devices all sit on
// the node its node selector names, and the devices allocated consume no
// more of a counter set (MIG on demand: a GPU's memory slices, compute
// slices, memory) than it has.
// It returns every violation found.
func CheckInvariants(claims []resourceapi.ResourceClaim, slices []resourceapi.ResourceSlice) error {
	type dev struct {
		capacity map[string]int64
		node     string
	}
	devices := map[string]*dev{}
	counters := map[string]int64{}            // pool/set/counter -> value
	consumes := map[string]map[string]int64{} // pool/device -> pool/set/counter -> value
	for _, s := range slices {
		if s.Spec.Driver != driver.Name {
			continue
		}
		for _, cs := range s.Spec.SharedCounters {
			for name, c := range cs.Counters {
				counters[s.Spec.Pool.Name+"/"+cs.Name+"/"+name] = c.Value.Value()
			}
		}
		for _, d := range s.Spec.Devices {
			for _, cc := range d.ConsumesCounters {
				for name, c := range cc.Counters {
					key := s.Spec.Pool.Name + "/" + d.Name
					if consumes[key] == nil {
						consumes[key] = map[string]int64{}
					}
					consumes[key][s.Spec.Pool.Name+"/"+cc.CounterSet+"/"+name] += c.Value.Value()
				}
			}
		}
		for _, d := range s.Spec.Devices {
			x := &dev{capacity: map[string]int64{}}
			if s.Spec.NodeName != nil {
				x.node = *s.Spec.NodeName
			}
			for name, c := range d.Capacity {
				x.capacity[string(name)] = c.Value.Value()
			}
			devices[s.Spec.Pool.Name+"/"+d.Name] = x
		}
	}
	whole := map[string][]string{}
	shares := map[string][]string{}
	consumed := map[string]map[string]int64{}
	var errs []string
	for _, c := range claims {
		a := c.Status.Allocation
		if a == nil {
			continue
		}
		claimKey := c.Namespace + "/" + c.Name
		node := ""
		if a.NodeSelector != nil && len(a.NodeSelector.NodeSelectorTerms) == 1 {
			for _, f := range a.NodeSelector.NodeSelectorTerms[0].MatchFields {
				if f.Key == "metadata.name" && len(f.Values) == 1 {
					node = f.Values[0]
				}
			}
		}
		for _, r := range a.Devices.Results {
			if r.Driver != driver.Name {
				if r.ShareID == nil && (r.AdminAccess == nil || !*r.AdminAccess) {
					key := r.Driver + "/" + r.Pool + "/" + r.Device
					whole[key] = append(whole[key], claimKey)
				}
				continue
			}
			key := r.Pool + "/" + r.Device
			d, ok := devices[key]
			if !ok {
				errs = append(errs, fmt.Sprintf("claim %s holds %s, which no slice publishes", claimKey, key))
				continue
			}
			if node != "" && d.node != node {
				errs = append(errs, fmt.Sprintf("claim %s holds %s on node %s but its node selector names %s", claimKey, key, d.node, node))
			}
			if r.ShareID == nil {
				whole[key] = append(whole[key], claimKey)
				continue
			}
			shares[key] = append(shares[key], claimKey)
			if consumed[key] == nil {
				consumed[key] = map[string]int64{}
			}
			for name, q := range r.ConsumedCapacity {
				consumed[key][string(name)] += q.Value()
			}
		}
	}
	for key, holders := range whole {
		if len(holders) > 1 {
			errs = append(errs, fmt.Sprintf("device %s is given out whole to %d claims: %s", key, len(holders), strings.Join(holders, ", ")))
		}
		if s := shares[key]; len(s) > 0 {
			errs = append(errs, fmt.Sprintf("device %s is given out whole to %s and shared with %s", key, holders[0], strings.Join(s, ", ")))
		}
	}
	counted := map[string]int64{}
	for key := range whole {
		for counter, v := range consumes[key] {
			counted[counter] += v
		}
	}
	for counter, v := range counted {
		if limit := counters[counter]; v > limit {
			errs = append(errs, fmt.Sprintf("counter %s: the allocated devices consume %d, it has %d", counter, v, limit))
		}
	}
	for key, used := range consumed {
		for name, v := range used {
			if limit, ok := devices[key].capacity[name]; ok && v > limit {
				errs = append(errs, fmt.Sprintf("device %s: shares consume %d of capacity %s, the device has %d (shares: %s)", key, v, name, limit, strings.Join(shares[key], ", ")))
			}
		}
	}
	if len(errs) == 0 {
		return nil
	}
	sort.Strings(errs)
	return fmt.Errorf("%d invariant violations:\n%s", len(errs), strings.Join(errs, "\n"))
}

// CheckClusterInvariants lists every ResourceClaim and ResourceSlice from
// the API server and runs CheckInvariants on them (integration and scale
// tests).
func CheckClusterInvariants(ctx context.Context, client kubernetes.Interface) error {
	claims, err := client.ResourceV1().ResourceClaims("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing ResourceClaims: %w", err)
	}
	slices, err := client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing ResourceSlices: %w", err)
	}
	return CheckInvariants(claims.Items, slices.Items)
}
