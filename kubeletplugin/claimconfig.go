package kubeletplugin

import (
	"fmt"
	"slices"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/dynamic-resource-allocation/resourceclaim"
	"k8s.io/klog/v2"

	apiv1alpha1 "github.com/gpulink/gpulink/api/v1alpha1"
	"github.com/gpulink/gpulink/driver"
)

// opaqueConfig is one of this driver's entries in allocation.devices.config.
type opaqueConfig struct {
	index    int // position in allocation.devices.config, for error messages
	source   resourceapi.AllocationConfigSource
	requests []string
	decoded  *apiv1alpha1.GpuConfig
}

// requestConfig is the effective configuration of one request.
type requestConfig struct {
	// resolved is decoded, merged, defaulted and validated.
	resolved *apiv1alpha1.GpuConfig
	// explicit is merged but not defaulted: it tells whether a share size
	// was set by a class or the claim rather than by the API default.
	explicit *apiv1alpha1.GpuConfig
}

// claimConfigs resolves the opaque configuration of a claim per request.
type claimConfigs struct {
	entries []opaqueConfig
	cache   map[string]*requestConfig
}

// newClaimConfigs decodes this driver's opaque config entries of an
// allocation. Entries of other drivers are ignored; a malformed entry of
// this driver is an error naming its index.
func newClaimConfigs(logger klog.Logger, alloc *resourceapi.AllocationResult) (*claimConfigs, error) {
	cc := &claimConfigs{cache: map[string]*requestConfig{}}
	for i, c := range alloc.Devices.Config {
		if c.Opaque == nil {
			continue
		}
		if c.Opaque.Driver != driver.Name {
			logger.V(5).Info("Ignoring config of another driver", "index", i, "driver", c.Opaque.Driver)
			continue
		}
		field := fmt.Sprintf("status.allocation.devices.config[%d].opaque.parameters", i)
		raw := c.Opaque.Parameters.Raw
		if len(raw) == 0 {
			return nil, fmt.Errorf("%s: empty", field)
		}
		decoded, err := apiv1alpha1.Decode(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", field, err)
		}
		cc.entries = append(cc.entries, opaqueConfig{
			index: i, source: c.Source, requests: c.Requests, decoded: decoded,
		})
	}
	// Class configs are the lower layer and claim configs override them,
	// whatever order the allocator listed them in; within a source the
	// listed order holds (later entries override earlier ones).
	sort.SliceStable(cc.entries, func(i, j int) bool {
		return cc.entries[i].source == resourceapi.AllocationConfigSourceClass &&
			cc.entries[j].source != resourceapi.AllocationConfigSourceClass
	})
	return cc, nil
}

// applies tells whether a config entry covers a result's request, which
// may be "<request>/<subrequest>"; an entry naming the main request covers
// all its subrequests.
func (e opaqueConfig) applies(request string) bool {
	if len(e.requests) == 0 {
		return true
	}
	base := resourceclaim.BaseRequestRef(request)
	return slices.Contains(e.requests, request) || slices.Contains(e.requests, base)
}

// forRequest returns the effective configuration of a request.
func (cc *claimConfigs) forRequest(request string) (*requestConfig, error) {
	if rc, ok := cc.cache[request]; ok {
		return rc, nil
	}
	var (
		class, claim []*apiv1alpha1.GpuConfig
		indices      []int
	)
	for _, e := range cc.entries {
		if !e.applies(request) {
			continue
		}
		// Only the allocator copies a DeviceClass's config into the
		// allocation (users cannot write status), so an entry marked
		// FromClass is the operator's; everything else is the claim's
		// and may only narrow it, the same rule the controller applies.
		// Claims kube-scheduler allocated get it here.
		if e.source == resourceapi.AllocationConfigSourceClass {
			class = append(class, e.decoded)
		} else {
			claim = append(claim, e.decoded)
		}
		indices = append(indices, e.index)
	}
	resolved, explicit, err := apiv1alpha1.ResolveDecoded(class, claim)
	if err != nil {
		return nil, fmt.Errorf("status.allocation.devices.config%v (the entries for request %q): %w", indices, request, err)
	}
	rc := &requestConfig{resolved: resolved, explicit: explicit}
	cc.cache[request] = rc
	return rc, nil
}
