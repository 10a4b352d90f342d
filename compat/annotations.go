package compat

import (
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/gpulink/gpulink/driver"
)

// HAMi's pod annotations that pick GPUs.
const (
	AnnotationUseGPUType    = "nvidia.com/use-gputype"
	AnnotationNoUseGPUType  = "nvidia.com/nouse-gputype"
	AnnotationUseGPUUUID    = "nvidia.com/use-gpuuuid"
	AnnotationNoUseGPUUUID  = "nvidia.com/nouse-gpuuuid"
	AnnotationNodePolicy    = "hami.io/node-scheduler-policy"
	AnnotationGPUPolicy     = "hami.io/gpu-scheduler-policy"
	hamiAnnotationPrefix    = "hami.io/"
	nvidiaUsePrefix         = "nvidia.com/use-"
	nvidiaNoUsePrefix       = "nvidia.com/nouse-"
	productNameAttrSelector = `device.attributes["` + driver.Name + `"].` + driver.AttrProductName
	uuidAttrSelector        = `device.attributes["` + driver.Name + `"].` + driver.AttrUUID
)

var (
	// Product names as NVML prints them ("NVIDIA A100-SXM4-40GB", "Tesla V100").
	productPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9 ._+-]*$`)
	// GPU UUIDs as NVML prints them.
	uuidPattern = regexp.MustCompile(`^GPU-[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$`)
)

// annotationSelectors turns HAMi's pod annotations into CEL selectors that
// every translated request of the pod gets. Annotations gpulink cannot
// honour are refused: a pod that asked for a GPU type must not silently
// get another.
func annotationSelectors(annotations map[string]string) ([]string, error) {
	var sels []string
	var errs []error
	keys := make([]string, 0, len(annotations))
	for k := range annotations {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		v := annotations[k]
		switch k {
		case AnnotationUseGPUType, AnnotationNoUseGPUType:
			list, err := splitList(k, v, productPattern, "a GPU product name (letters, digits, space . _ + -)")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			// HAMi matches a type as a case-insensitive substring of
			// the product name ("A100" matches "NVIDIA A100-SXM4-40GB").
			terms := make([]string, len(list))
			for i, p := range list {
				terms[i] = productNameAttrSelector + ".upperAscii().contains(" + strconv.Quote(strings.ToUpper(p)) + ")"
			}
			expr := strings.Join(terms, " || ")
			if k == AnnotationNoUseGPUType {
				expr = "!(" + expr + ")"
			}
			sels = append(sels, expr)
		case AnnotationUseGPUUUID, AnnotationNoUseGPUUUID:
			list, err := splitList(k, v, uuidPattern, "a GPU UUID (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
			if err != nil {
				errs = append(errs, err)
				continue
			}
			quoted := make([]string, len(list))
			for i, u := range list {
				quoted[i] = strconv.Quote(u)
			}
			expr := uuidAttrSelector + " in [" + strings.Join(quoted, ", ") + "]"
			if k == AnnotationNoUseGPUUUID {
				expr = "!(" + expr + ")"
			}
			sels = append(sels, expr)
		case AnnotationNodePolicy, AnnotationGPUPolicy:
			// The pod's own packing policy: the controller reads it from
			// the pod when it places the pod's claims (the claims are
			// the pod's alone, so the template need not say it).
			if err := validPolicy(k, v); err != nil {
				errs = append(errs, err)
			}
		default:
			if strings.HasPrefix(k, hamiAnnotationPrefix) || strings.HasPrefix(k, nvidiaUsePrefix) || strings.HasPrefix(k, nvidiaNoUsePrefix) {
				errs = append(errs, fmt.Errorf("annotation %s=%q is not supported by gpulink (supported: %s, %s, %s, %s, %s, %s)",
					k, v, AnnotationUseGPUType, AnnotationNoUseGPUType, AnnotationUseGPUUUID, AnnotationNoUseGPUUUID, AnnotationNodePolicy, AnnotationGPUPolicy))
			}
		}
	}
	return sels, errors.Join(errs...)
}

func splitList(key, v string, pattern *regexp.Regexp, what string) ([]string, error) {
	var out []string
	for _, item := range strings.Split(v, ",") {
		item = strings.TrimSpace(item)
		if !pattern.MatchString(item) {
			return nil, fmt.Errorf("annotation %s=%q: %q is not %s", key, v, item, what)
		}
		out = append(out, item)
	}
	return out, nil
}

func validPolicy(key, v string) error {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "binpack", "spread":
		return nil
	}
	return fmt.Errorf("annotation %s=%q: want binpack or spread", key, v)
}
