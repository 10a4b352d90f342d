package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/yaml"

	"github.com/gpulink/gpulink/internal/yamldoc"
)

// decodeStrict decodes a YAML or JSON document into out (a pointer to a
// struct). Before the decode it walks the document against out's type, so
// that an unknown field, a key in the wrong case or a value of the wrong
// type is reported with its full path ("steps[2].gpus: ..."), which
// encoding/json cannot do: it names unknown fields without their path,
// matches keys case-insensitively and loses list indices. All problems
// found are returned at once.
func decodeStrict(raw []byte, out any) error {
	if err := yamldoc.SingleDocument(raw); err != nil {
		return err
	}
	doc, err := yaml.YAMLToJSONStrict(raw)
	if err != nil {
		return err
	}
	var tree any
	if err := json.Unmarshal(doc, &tree); err != nil {
		return err
	}
	if tree == nil {
		return errors.New("document is empty")
	}
	if err := joinProblems(checkShape(tree, reflect.TypeOf(out).Elem(), nil)); err != nil {
		return err
	}
	if err := json.Unmarshal(doc, out); err != nil {
		return fmt.Errorf("decoding after a successful shape check: %w", err)
	}
	return nil
}

var jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()

// checkShape reports every place where the generic JSON value v does not
// fit Go type t. path is nil at the document root.
func checkShape(v any, t reflect.Type, path *field.Path) []error {
	if v == nil {
		return nil // null leaves the field at its zero value
	}
	if t.Kind() != reflect.Pointer && reflect.PointerTo(t).Implements(jsonUnmarshaler) {
		return checkUnmarshaler(v, t, path)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return checkShape(v, t.Elem(), path)
	case reflect.Struct:
		obj, ok := v.(map[string]any)
		if !ok {
			return []error{shapeError(path, v, "an object")}
		}
		fields := jsonFields(t)
		var errs []error
		for _, key := range sortedKeys(obj) {
			f, known := fields[key]
			if !known {
				errs = append(errs, fmt.Errorf("%s: unknown field", pathString(path.Child(key))))
				continue
			}
			errs = append(errs, checkShape(obj[key], f.Type, path.Child(key))...)
		}
		return errs
	case reflect.Slice:
		list, ok := v.([]any)
		if !ok {
			return []error{shapeError(path, v, "a list")}
		}
		var errs []error
		for i, item := range list {
			errs = append(errs, checkShape(item, t.Elem(), path.Index(i))...)
		}
		return errs
	case reflect.String:
		if _, ok := v.(string); !ok {
			return []error{shapeError(path, v, "a string")}
		}
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			return []error{shapeError(path, v, "true or false")}
		}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := v.(float64)
		if !ok || n != math.Trunc(n) || n < math.MinInt64 || n >= math.MaxInt64 ||
			reflect.Zero(t).OverflowInt(int64(n)) {
			return []error{shapeError(path, v, "an integer")}
		}
	case reflect.Float32, reflect.Float64:
		if _, ok := v.(float64); !ok {
			return []error{shapeError(path, v, "a number")}
		}
	default:
		// Every type decodeStrict is used with is covered above; reaching
		// this is a programming error in a new field, not bad input.
		return []error{fmt.Errorf("%s: field of Go type %s is not supported by the strict decoder", pathString(path), t)}
	}
	return nil
}

// checkUnmarshaler lets a type with its own JSON syntax (resource.Quantity)
// judge the value, so its error can be tied to the path.
func checkUnmarshaler(v any, t reflect.Type, path *field.Path) []error {
	b, err := json.Marshal(v)
	if err != nil {
		return []error{fmt.Errorf("%s: %w", pathString(path), err)}
	}
	target := reflect.New(t).Interface().(json.Unmarshaler)
	if err := target.UnmarshalJSON(b); err != nil {
		return []error{fmt.Errorf("%s: invalid value %s: %w", pathString(path), b, err)}
	}
	return nil
}

// jsonFields maps the JSON names of t's fields to the fields, following
// embedded structs the way encoding/json does.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, sub := range jsonFields(f.Type) {
				out[k] = sub
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out[name] = f
	}
	return out
}

func shapeError(path *field.Path, v any, want string) error {
	b, err := json.Marshal(v)
	if err != nil {
		b = []byte(fmt.Sprint(v))
	}
	return fmt.Errorf("%s: must be %s, got %s", pathString(path), want, b)
}

func pathString(path *field.Path) string {
	if path == nil {
		return "(document)"
	}
	return path.String()
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
