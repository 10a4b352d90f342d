package compat

// MIG resources of the NVIDIA device plugin's mixed strategy.

import (
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpulink/gpulink/driver"
	"github.com/gpulink/gpulink/driver/topology"
)

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
