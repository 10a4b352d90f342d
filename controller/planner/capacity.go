package planner

import (
	"fmt"
	"sort"

	resourceapi "k8s.io/api/resource/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// consumption computes what a share takes from one capacity of a device,
// following the API's rules for consumable capacity: an explicit request is
// rounded up to the requestPolicy (validRange min/step, or the next
// validValues entry); without a request the policy's default applies, or
// the whole capacity when there is no default. It fails when the result
// exceeds the policy's maximum, has no valid value, or exceeds the device.
func consumption(requested *resource.Quantity, c resourceapi.DeviceCapacity) (int64, error) {
	total := c.Value.Value()
	pol := c.RequestPolicy
	var v int64
	switch {
	case requested == nil && pol != nil && pol.Default != nil:
		v = pol.Default.Value()
	case requested == nil:
		v = total
	case pol == nil:
		v = requested.Value()
	case pol.ValidRange != nil && pol.ValidRange.Min != nil:
		r := pol.ValidRange
		v = requested.Value()
		lo := r.Min.Value()
		if v < lo {
			v = lo
		} else if r.Step != nil && r.Step.Value() > 0 {
			step := r.Step.Value()
			n := (v - lo + step - 1) / step
			v = lo + n*step
		}
		if r.Max != nil && v > r.Max.Value() {
			return 0, fmt.Errorf("%s rounds up to %s, above the device's maximum %s", requested.String(), quantityString(v, requested.Format), r.Max.String())
		}
	case len(pol.ValidValues) > 0:
		vals := append([]resource.Quantity(nil), pol.ValidValues...)
		sort.Slice(vals, func(i, j int) bool { return vals[i].Cmp(vals[j]) < 0 })
		found := false
		for _, q := range vals {
			if requested.Cmp(q) <= 0 {
				v, found = q.Value(), true
				break
			}
		}
		if !found {
			return 0, fmt.Errorf("%s is above every valid value of the device (largest %s)", requested.String(), vals[len(vals)-1].String())
		}
	default:
		v = requested.Value()
	}
	if v <= 0 && requested != nil {
		return 0, fmt.Errorf("%s is not a positive amount", requested.String())
	}
	if v > total {
		return 0, fmt.Errorf("%s is more than the device has (%s)", quantityString(v, c.Value.Format), c.Value.String())
	}
	return v, nil
}

func quantityString(v int64, f resource.Format) string {
	if f == "" {
		f = resource.DecimalSI
	}
	return resource.NewQuantity(v, f).String()
}
