//go:build e2e

package conformance_test

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/test/localcluster"
)

// obj is one document of a peer manifest as generic YAML: ported by
// editing fields, so that what a port changes is visible in code and
// everything else reaches the API server as the peer wrote it.
type obj = map[string]any

// peerClasses are the peers' DeviceClasses for whole devices. A request on
// one of them with a capacity request becomes a share on gpulink.
var peerClasses = map[string]bool{
	"gpu.nvidia.com":                true,
	"gpu.example.com":               true,
	"hami-core-gpu.project-hami.io": true,
	"example":                       true, // Kubernetes' e2e test driver
}

// peerDomains are the attribute domains the peers' CEL selectors use.
var peerDomains = []string{"gpu.nvidia.com", "gpu.example.com"}

// portOptions are a case's edits beyond the common ones.
type portOptions struct {
	// index replaces __INDEX__ (the bats suite's sed substitution).
	index string
	// attributes replaces text in CEL selectors (peer attribute names
	// and values → gpulink's), e.g. ".model == 'LATEST-GPU-MODEL'", in
	// order (the longer pattern first).
	attributes [][2]string
	// capacities renames capacity requests (peer → gpulink); a capacity
	// mapped to "" is dropped.
	capacities map[string]string
	// dropConfig drops the opaque config of these drivers (their
	// settings have no gpulink equivalent or are replaced by capacity).
	dropConfig map[string]bool
	// shareCapacity turns the named requests (all when "*") into shares
	// with this capacity request.
	shareCapacity map[string]map[string]any
	// shareClass moves whole-GPU requests to the share class (with its
	// default share) where the peer shares a GPU without a capacity.
	shareClass bool
	// dropCPU drops containers' CPU requests and limits the 2-core test
	// node cannot hold.
	dropCPU bool
	// exitAfterPrint makes the workload exit once it printed what it
	// sees, for pods the peer expects to complete (Jobs, restartPolicy
	// Never commands).
	exitAfterPrint bool
}

// parseManifest splits a manifest into its documents, with __INDEX__
// substituted.
func parseManifest(file string, data []byte, index string) ([]obj, error) {
	text := string(data)
	if index != "" {
		text = strings.ReplaceAll(text, "__INDEX__", index)
	}
	var out []obj
	for i, doc := range strings.Split("\n"+text, "\n---") {
		var o obj
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			return nil, fmt.Errorf("%s: document %d: %w", file, i, err)
		}
		if len(o) == 0 {
			continue // comments only
		}
		out = append(out, o)
	}
	return out, nil
}

// port rewrites one document for gpulink on the real node.
func port(o obj, node string, opts portOptions) error {
	kind, _ := o["kind"].(string)
	switch kind {
	case "ResourceClaim":
		if o["apiVersion"] == "resource.k8s.io/v1beta1" {
			wrapExactly(m(o, "spec"))
		}
		o["apiVersion"] = "resource.k8s.io/v1"
		return portClaimSpec(m(o, "spec"), opts)
	case "ResourceClaimTemplate":
		if o["apiVersion"] == "resource.k8s.io/v1beta1" {
			wrapExactly(m(m(o, "spec"), "spec"))
		}
		o["apiVersion"] = "resource.k8s.io/v1"
		return portClaimSpec(m(m(o, "spec"), "spec"), opts)
	case "DeviceTaintRule":
		// GA in 1.37: resource.k8s.io/v1 serves it.
		o["apiVersion"] = "resource.k8s.io/v1"
		sel := m(m(o, "spec"), "deviceSelector")
		if _, ok := sel["driver"]; ok {
			sel["driver"] = driver.Name
		}
	case "Pod":
		portPodSpec(m(o, "spec"), node, opts)
	case "Deployment", "Job", "ReplicaSet", "StatefulSet":
		portPodSpec(m(m(m(o, "spec"), "template"), "spec"), node, opts)
	}
	return nil
}

// wrapExactly moves v1beta1's request fields into v1's `exactly`.
func wrapExactly(spec obj) {
	for _, r := range list(m(spec, "devices")["requests"]) {
		req := r.(obj)
		if _, ok := req["firstAvailable"]; ok {
			continue
		}
		exactly := obj{}
		for k, v := range req {
			if k != "name" {
				exactly[k] = v
				delete(req, k)
			}
		}
		req["exactly"] = exactly
	}
}

// portClaimSpec renames classes, CEL domains and attributes and capacities,
// and drops or keeps opaque configs.
func portClaimSpec(spec obj, opts portOptions) error {
	devices := m(spec, "devices")
	for _, r := range list(devices["requests"]) {
		req := r.(obj)
		name, _ := req["name"].(string)
		var subs []obj
		if ex, ok := req["exactly"].(obj); ok {
			subs = append(subs, ex)
		}
		for _, s := range list(req["firstAvailable"]) {
			subs = append(subs, s.(obj))
		}
		for _, sub := range subs {
			if c, ok := opts.shareCapacity[name]; ok {
				sub["capacity"] = obj{"requests": c}
			} else if c, ok := opts.shareCapacity["*"]; ok {
				sub["capacity"] = obj{"requests": c}
			}
			if err := portRequest(sub, opts); err != nil {
				return fmt.Errorf("request %s: %w", name, err)
			}
		}
	}
	var configs []any
	for _, c := range list(devices["config"]) {
		opaque, _ := c.(obj)["opaque"].(obj)
		if opaque != nil && opts.dropConfig[fmt.Sprint(opaque["driver"])] {
			continue
		}
		configs = append(configs, c)
	}
	if configs == nil {
		delete(devices, "config")
	} else {
		devices["config"] = configs
	}
	return nil
}

// portRequest ports one exact request or subrequest.
func portRequest(req obj, opts portOptions) error {
	class, _ := req["deviceClassName"].(string)
	if whole, known := peerClasses[class]; known && whole {
		req["deviceClassName"] = driver.DeviceClassWhole
	}
	capacity, _ := req["capacity"].(obj)
	if capReq, ok := capacity["requests"].(obj); ok {
		for from, to := range opts.capacities {
			if v, ok := capReq[from]; ok {
				delete(capReq, from)
				if to != "" {
					capReq[to] = v
				}
			}
		}
		if len(capReq) == 0 {
			delete(req, "capacity")
		}
		if len(capReq) > 0 && req["deviceClassName"] == driver.DeviceClassWhole {
			// gpulink gives out shares through its share class.
			req["deviceClassName"] = driver.DeviceClassShare
		}
	}
	if opts.shareClass && req["deviceClassName"] == driver.DeviceClassWhole {
		req["deviceClassName"] = driver.DeviceClassShare
	}
	for _, s := range list(req["selectors"]) {
		cel := m(s.(obj), "cel")
		expr, _ := cel["expression"].(string)
		for _, d := range peerDomains {
			expr = strings.ReplaceAll(expr, d, driver.Name)
		}
		for _, r := range opts.attributes {
			expr = strings.ReplaceAll(expr, r[0], r[1])
		}
		cel["expression"] = expr
	}
	return nil
}

// portPodSpec runs the workload image in every container in place of the
// peer's image and command (it prints what the container sees and
// sleeps), on the real node with host networking (the local cluster has
// no CNI).
func portPodSpec(spec obj, node string, opts portOptions) {
	for _, key := range []string{"initContainers", "containers"} {
		for _, c := range list(spec[key]) {
			ctr := c.(obj)
			ctr["image"] = localcluster.WorkloadImage
			ctr["imagePullPolicy"] = string(corev1.PullNever)
			delete(ctr, "command")
			delete(ctr, "args")
			delete(ctr, "livenessProbe")
			delete(ctr, "readinessProbe")
			if res, ok := ctr["resources"].(obj); ok && opts.dropCPU {
				for _, k := range []string{"requests", "limits"} {
					if l, ok := res[k].(obj); ok {
						delete(l, "cpu")
					}
				}
			}
			if key == "initContainers" || opts.exitAfterPrint {
				envs := list(ctr["env"])
				ctr["env"] = append(envs, obj{"name": "GPULINK_WORKLOAD_EXIT", "value": "1"})
			}
		}
	}
	sel := m(spec, "nodeSelector")
	sel[corev1.LabelHostname] = node
	spec["hostNetwork"] = true
	spec["terminationGracePeriodSeconds"] = 1
	delete(spec, "dnsPolicy")
}

// m returns o[key] as a map, creating it when absent.
func m(o obj, key string) obj {
	if v, ok := o[key].(obj); ok {
		return v
	}
	v := obj{}
	o[key] = v
	return v
}

// list returns v as a list (nil when it is not one).
func list(v any) []any {
	l, _ := v.([]any)
	return l
}
