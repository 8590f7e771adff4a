// Go types and Java types: the type table, the JVM descriptors of
// parameter types, and the registration of POJOs.

package dubbo

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"time"

	hessian "github.com/apache/dubbo-go-hessian2"
)

// ErrDescriptor reports parameter types that do not parse, or that do not
// match the arguments a body holds.
var ErrDescriptor = errors.New("dubbo: parameter types do not match")

// primitives maps a JVM descriptor letter to its Java type.
var primitives = map[byte]string{
	'Z': "boolean", 'B': "byte", 'C': "char", 'S': "short",
	'I': "int", 'J': "long", 'F': "float", 'D': "double",
}

// letters is primitives the other way round.
var letters = func() map[string]byte {
	m := make(map[string]byte, len(primitives))
	for l, t := range primitives {
		m[t] = l
	}
	return m
}()

// ParseDesc splits a JVM parameter descriptor, as Dubbo sends it, into
// Java type names: "JI" is long and int, "Ljava/lang/String;" is
// java.lang.String, "[I" is int[]. The empty descriptor has no types.
func ParseDesc(desc string) ([]string, error) {
	var types []string
	for i := 0; i < len(desc); {
		dims := 0
		for i < len(desc) && desc[i] == '[' {
			dims++
			i++
		}
		if i == len(desc) {
			return nil, fmt.Errorf("%w: descriptor %q ends inside an array type", ErrDescriptor, desc)
		}
		var name string
		if t, ok := primitives[desc[i]]; ok {
			name = t
			i++
		} else if desc[i] == 'L' {
			end := strings.IndexByte(desc[i:], ';')
			if end < 2 {
				return nil, fmt.Errorf("%w: descriptor %q has a class type without a name or ';'", ErrDescriptor, desc)
			}
			name = strings.ReplaceAll(desc[i+1:i+end], "/", ".")
			i += end + 1
		} else {
			return nil, fmt.Errorf("%w: descriptor %q has %q at offset %d", ErrDescriptor, desc, desc[i], i)
		}
		types = append(types, name+strings.Repeat("[]", dims))
	}
	return types, nil
}

// MakeDesc joins Java type names into a JVM parameter descriptor, the
// inverse of ParseDesc: MakeDesc("long", "int") is "JI".
func MakeDesc(javaTypes ...string) (string, error) {
	var b strings.Builder
	for _, t := range javaTypes {
		base := strings.TrimRight(t, "[]")
		dims := (len(t) - len(base)) / 2
		if base == "" || base+strings.Repeat("[]", dims) != t || strings.ContainsAny(base, "/;[] ") {
			return "", fmt.Errorf("%w: %q is not a Java type name", ErrDescriptor, t)
		}
		b.WriteString(strings.Repeat("[", dims))
		if l, ok := letters[base]; ok {
			b.WriteByte(l)
			continue
		}
		b.WriteString("L" + strings.ReplaceAll(base, ".", "/") + ";")
	}
	return b.String(), nil
}

// pojos maps a registered Go struct type to its Java class name.
var pojos sync.Map // reflect.Type → string

// pojoClasses is the set of registered Java class names.
var pojoClasses sync.Map // string → reflect.Type

// RegisterPOJO makes the Go struct type of prototype (a struct or a
// pointer to one) the Java class javaClass in hessian2 bodies, both ways.
// Fields map by name: a Go field Name is the Java field name, unless a
// `hessian:"javaName"` tag says otherwise. A decoded object of that class
// is a pointer to the struct. Registering a class twice with the same type
// is a no-op; with another type it is an error.
func RegisterPOJO(javaClass string, prototype any) error {
	t := reflect.TypeOf(prototype)
	if t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t == nil || t.Kind() != reflect.Struct {
		return fmt.Errorf("dubbo: RegisterPOJO(%q): %T is not a struct", javaClass, prototype)
	}
	if !isClassName(javaClass) {
		return fmt.Errorf("dubbo: RegisterPOJO: %q is not a Java class name", javaClass)
	}
	if old, ok := pojoClasses.Load(javaClass); ok {
		if old.(reflect.Type) != t {
			return fmt.Errorf("dubbo: RegisterPOJO(%q): already registered as %v", javaClass, old)
		}
		return nil
	}
	if old, ok := pojos.Load(t); ok {
		return fmt.Errorf("dubbo: RegisterPOJO(%q): %v is already registered as %s", javaClass, t, old)
	}
	hessian.RegisterPOJOMapping(javaClass, reflect.New(t).Interface())
	pojos.Store(t, javaClass)
	pojoClasses.Store(javaClass, t)
	return nil
}

var (
	timeType  = reflect.TypeOf(time.Time{})
	bytesType = reflect.TypeOf([]byte(nil))
)

// boxed maps a Java primitive to the class of its boxed form, the type a
// Go pointer to it has: *int32 is java.lang.Integer.
var boxed = map[string]string{
	"boolean": "java.lang.Boolean", "byte": "java.lang.Byte", "short": "java.lang.Short",
	"int": "java.lang.Integer", "long": "java.lang.Long", "float": "java.lang.Float",
	"double": "java.lang.Double",
}

// JavaType returns the Java type of the Go type t, as docs/dubbo.md's
// table gives it: bool is boolean, int32 int, int64 and int long, string
// java.lang.String, a pointer to a primitive its boxed class, []byte
// byte[], []any java.util.List, another slice an array, a map
// java.util.Map, time.Time java.util.Date, a registered struct (or a
// pointer to one) its Java class.
func JavaType(t reflect.Type) (string, error) {
	if t == nil {
		return "", fmt.Errorf("%w: a nil argument has no Java type; give the types", ErrDescriptor)
	}
	switch t.Kind() {
	case reflect.Bool:
		return "boolean", nil
	case reflect.Int8:
		return "byte", nil
	case reflect.Int16:
		return "short", nil
	case reflect.Int32:
		return "int", nil
	case reflect.Int64, reflect.Int:
		return "long", nil
	case reflect.Float32:
		return "float", nil
	case reflect.Float64:
		return "double", nil
	case reflect.String:
		return "java.lang.String", nil
	case reflect.Map:
		return "java.util.Map", nil
	case reflect.Interface:
		return "java.lang.Object", nil
	case reflect.Slice:
		if t == bytesType {
			return "byte[]", nil
		}
		if t.Elem().Kind() == reflect.Interface {
			return "java.util.List", nil
		}
		elem, err := JavaType(t.Elem())
		if err != nil {
			return "", err
		}
		return elem + "[]", nil
	case reflect.Struct:
		if t == timeType {
			return "java.util.Date", nil
		}
		if name, ok := pojos.Load(t); ok {
			return name.(string), nil
		}
		return "", fmt.Errorf("%w: %v is not registered with RegisterPOJO", ErrUnknownClass, t)
	case reflect.Pointer:
		inner, err := JavaType(t.Elem())
		if err != nil {
			return "", err
		}
		if b, ok := boxed[inner]; ok {
			return b, nil
		}
		return inner, nil
	}
	return "", fmt.Errorf("%w: Go type %v has no Java type", ErrDescriptor, t)
}

// DescOf returns the descriptor of arguments by their Go types, as
// JavaType maps them; a nil argument is an error, since its type is unknown.
func DescOf(args ...any) (string, error) {
	types := make([]string, len(args))
	for i, a := range args {
		t, err := JavaType(reflect.TypeOf(a))
		if err != nil {
			return "", fmt.Errorf("argument %d: %w", i, err)
		}
		types[i] = t
	}
	return MakeDesc(types...)
}

// checkArg says whether a decoded argument fits its declared Java type.
// Primitives, their boxed classes, strings and registered classes are
// checked; other types are left to the handler.
func checkArg(javaType string, v any) bool {
	if v == nil {
		_, primitive := letters[javaType]
		return !primitive
	}
	switch javaType {
	case "boolean", "java.lang.Boolean":
		_, ok := v.(bool)
		return ok
	case "byte", "short", "int", "java.lang.Byte", "java.lang.Short", "java.lang.Integer":
		_, ok := v.(int32)
		return ok
	case "long", "java.lang.Long":
		_, ok := v.(int64)
		return ok
	case "float", "double", "java.lang.Float", "java.lang.Double":
		_, ok := v.(float64)
		return ok
	case "char", "java.lang.Character", "java.lang.String":
		_, ok := v.(string)
		return ok
	}
	if t, ok := pojoClasses.Load(javaType); ok {
		return reflect.TypeOf(v) == reflect.PointerTo(t.(reflect.Type))
	}
	return true
}
