// Conversions between decoded hessian2 values and a Go method's parameter
// and result types, for typed and generic calls.

package dubbo

import (
	"fmt"
	"math"
	"reflect"
	"strings"
	"unicode"
	"unicode/utf8"
)

// convert returns v, a decoded hessian2 value, as a value of the Go type t.
// Integers widen, and narrow when the value fits; a map becomes a
// registered struct by its field names (the generic call's form of a
// POJO); a list becomes a slice element by element. Any other mismatch is
// an error.
func convert(v any, t reflect.Type) (reflect.Value, error) {
	if v == nil {
		switch t.Kind() {
		case reflect.Pointer, reflect.Interface, reflect.Slice, reflect.Map:
			return reflect.Zero(t), nil
		}
		return reflect.Value{}, fmt.Errorf("null for a %v", t)
	}
	rv := reflect.ValueOf(v)
	if rv.Type() == t {
		return rv, nil
	}
	if t.Kind() == reflect.Interface {
		if rv.Type().Implements(t) {
			out := reflect.New(t).Elem()
			out.Set(rv)
			return out, nil
		}
		return reflect.Value{}, fmt.Errorf("a %T for a %v", v, t)
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		n, ok := integer(v)
		if !ok {
			break
		}
		out := reflect.New(t).Elem()
		if out.OverflowInt(n) {
			return reflect.Value{}, fmt.Errorf("%d overflows a %v", n, t)
		}
		out.SetInt(n)
		return out, nil
	case reflect.Float32, reflect.Float64:
		var f float64
		switch x := v.(type) {
		case float64:
			f = x
		case int32:
			f = float64(x)
		case int64:
			f = float64(x)
		default:
			return reflect.Value{}, fmt.Errorf("a %T for a %v", v, t)
		}
		if t.Kind() == reflect.Float32 && math.Abs(f) > math.MaxFloat32 && !math.IsInf(f, 0) {
			return reflect.Value{}, fmt.Errorf("%g overflows a float32", f)
		}
		return reflect.ValueOf(f).Convert(t), nil
	case reflect.Pointer:
		if t.Elem().Kind() == reflect.Struct {
			if m, ok := stringKeyed(v); ok {
				return structFromMap(m, t.Elem())
			}
			break
		}
		inner, err := convert(v, t.Elem())
		if err != nil {
			return reflect.Value{}, err
		}
		p := reflect.New(t.Elem())
		p.Elem().Set(inner)
		return p, nil
	case reflect.Struct:
		if p := rv; p.Kind() == reflect.Pointer && p.Type().Elem() == t && !p.IsNil() {
			return p.Elem(), nil
		}
		if m, ok := stringKeyed(v); ok {
			p, err := structFromMap(m, t)
			if err != nil {
				return reflect.Value{}, err
			}
			return p.Elem(), nil
		}
	case reflect.Slice:
		if rv.Kind() != reflect.Slice {
			break
		}
		out := reflect.MakeSlice(t, rv.Len(), rv.Len())
		for i := range rv.Len() {
			e, err := convert(rv.Index(i).Interface(), t.Elem())
			if err != nil {
				return reflect.Value{}, fmt.Errorf("element %d: %w", i, err)
			}
			out.Index(i).Set(e)
		}
		return out, nil
	case reflect.Map:
		if rv.Kind() != reflect.Map {
			break
		}
		out := reflect.MakeMapWithSize(t, rv.Len())
		for it := rv.MapRange(); it.Next(); {
			k, err := convert(it.Key().Interface(), t.Key())
			if err != nil {
				return reflect.Value{}, fmt.Errorf("map key: %w", err)
			}
			e, err := convert(it.Value().Interface(), t.Elem())
			if err != nil {
				return reflect.Value{}, fmt.Errorf("map value %v: %w", it.Key().Interface(), err)
			}
			out.SetMapIndex(k, e)
		}
		return out, nil
	}
	return reflect.Value{}, fmt.Errorf("a %T for a %v", v, t)
}

// integer returns a decoded integer's value.
func integer(v any) (int64, bool) {
	switch x := v.(type) {
	case int32:
		return int64(x), true
	case int64:
		return x, true
	}
	return 0, false
}

// stringKeyed returns a decoded map with string keys.
func stringKeyed(v any) (map[string]any, bool) {
	switch m := v.(type) {
	case map[string]any:
		return m, true
	case map[any]any:
		out := make(map[string]any, len(m))
		for k, e := range m {
			ks, ok := k.(string)
			if !ok {
				return nil, false
			}
			out[ks] = e
		}
		return out, true
	}
	return nil, false
}

// structFromMap builds a *t from a generic call's map of a POJO: each
// exported field from the entry of its Java name. A "class" entry, when
// present, must name t's registered class; other entries are ignored, as
// Java's PojoUtils ignores them.
func structFromMap(m map[string]any, t reflect.Type) (reflect.Value, error) {
	if c, ok := m["class"]; ok {
		want, _ := pojos.Load(t)
		if name, _ := c.(string); want == nil || name != want {
			return reflect.Value{}, fmt.Errorf("a map of class %v for a %v (class %v)", c, t, want)
		}
	}
	p := reflect.New(t)
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		v, ok := m[javaField(f)]
		if !ok {
			continue
		}
		fv, err := convert(v, f.Type)
		if err != nil {
			return reflect.Value{}, fmt.Errorf("field %s: %w", javaField(f), err)
		}
		p.Elem().Field(i).Set(fv)
	}
	return p, nil
}

// javaField is the Java name of a POJO's field, as the hessian2 library
// maps it: the hessian tag, else the Go name with a lower-case first
// letter.
func javaField(f reflect.StructField) string {
	if tag := f.Tag.Get("hessian"); tag != "" {
		return tag
	}
	r, n := utf8.DecodeRuneInString(f.Name)
	return string(unicode.ToLower(r)) + f.Name[n:]
}

// generalize returns v as Java's generic call returns a result: a
// registered POJO as a map of its fields with its class under "class",
// slices and maps element by element, anything else as it is.
func generalize(v reflect.Value) any {
	if !v.IsValid() {
		return nil
	}
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface:
		if v.IsNil() {
			return nil
		}
		return generalize(v.Elem())
	case reflect.Struct:
		if v.Type() == timeType {
			return v.Interface()
		}
		m := make(map[string]any, v.NumField()+1)
		if name, ok := pojos.Load(v.Type()); ok {
			m["class"] = name
		}
		for i := range v.NumField() {
			f := v.Type().Field(i)
			if f.IsExported() {
				m[javaField(f)] = generalize(v.Field(i))
			}
		}
		return m
	case reflect.Slice:
		if v.IsNil() {
			return nil
		}
		if v.Type() == bytesType {
			return v.Interface()
		}
		out := make([]any, v.Len())
		for i := range out {
			out[i] = generalize(v.Index(i))
		}
		return out
	case reflect.Map:
		if v.IsNil() {
			return nil
		}
		out := make(map[any]any, v.Len())
		for it := v.MapRange(); it.Next(); {
			out[generalize(it.Key())] = generalize(it.Value())
		}
		return out
	}
	return v.Interface()
}

// javaTypeName normalizes a type name of a generic call: a JVM array
// descriptor ("[J", "[Ljava.lang.String;") becomes the name ParseDesc
// gives ("long[]").
func javaTypeName(name string) string {
	if !strings.HasPrefix(name, "[") {
		return name
	}
	types, err := ParseDesc(strings.ReplaceAll(name, ".", "/"))
	if err != nil || len(types) != 1 {
		return name
	}
	return types[0]
}
