package v1alpha1

import (
	"fmt"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"
)

// precheck reports what the strict decode would report badly: a document
// that is not an object, a wrong or missing apiVersion or kind (the decoder
// would say "no kind is registered" without naming the expected value), and
// a malformed quantity (resource.Quantity's own error names no field).
func precheck(raw []byte) error {
	var doc any
	if err := yaml.Unmarshal(raw, &doc); err != nil {
		return err
	}
	obj, ok := doc.(map[string]any)
	if !ok {
		return fmt.Errorf("document must be a JSON or YAML object, got %s", describe(doc))
	}
	var errs field.ErrorList
	errs = append(errs, checkIdentity(obj, "apiVersion", APIVersion)...)
	errs = append(errs, checkIdentity(obj, "kind", Kind)...)
	if sharing, ok := obj["sharing"].(map[string]any); ok {
		if v, set := sharing["defaultMemory"]; set && v != nil {
			path := field.NewPath("sharing", "defaultMemory")
			switch v := v.(type) {
			case string:
				if _, err := resource.ParseQuantity(v); err != nil {
					errs = append(errs, field.Invalid(path, v, err.Error()))
				}
			case float64:
				// Plain numbers are bytes; Quantity accepts them as is.
			default:
				errs = append(errs, field.Invalid(path, v, "must be a quantity such as 4Gi, got "+describe(v)))
			}
		}
		// A fraction would otherwise fail in the JSON decoder with a
		// message about Go types; name the field and the values instead.
		// A number or an object would fail in the JSON decoder naming a
		// Go type; name the values instead.
		if v, set := sharing["mpsMode"]; set && v != nil {
			if _, ok := v.(string); !ok {
				errs = append(errs, field.Invalid(field.NewPath("sharing", "mpsMode"), v, mpsModeValues+", got "+describe(v)))
			}
		}
		if v, set := sharing["priority"]; set && v != nil {
			if f, ok := v.(float64); !ok || (f != PriorityHigh && f != PriorityLow) {
				errs = append(errs, field.Invalid(field.NewPath("sharing", "priority"), v, priorityRange))
			}
		}
	}
	return errs.ToAggregate()
}

func checkIdentity(obj map[string]any, name, want string) field.ErrorList {
	path := field.NewPath(name)
	v, set := obj[name]
	if !set || v == nil || v == "" {
		return field.ErrorList{field.Required(path, "must be "+want)}
	}
	s, ok := v.(string)
	if !ok {
		return field.ErrorList{field.Invalid(path, v, "must be the string "+want)}
	}
	if s != want {
		return field.ErrorList{field.NotSupported(path, s, []string{want})}
	}
	return nil
}

// describe names the JSON type of a value decoded by sigs.k8s.io/yaml.
func describe(v any) string {
	switch v.(type) {
	case nil:
		return "null"
	case map[string]any:
		return "an object"
	case []any:
		return "an array"
	case string:
		return "a string"
	case float64:
		return "a number"
	case bool:
		return "a boolean"
	default:
		return fmt.Sprintf("%T", v)
	}
}
