// Dubbo's generic call ($invoke) and echo ($echo) on a Service: the method
// resolved as Java's GenericFilter resolves it, POJOs as maps.

package dubbo

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/protocol"
)

// generic serves $invoke and $invokeAsync: the arguments are the method
// name, its Java parameter types (null for "by name alone") and its
// arguments, POJOs as maps with their fields. The result comes back
// generalized: a POJO as a map with its class under "class".
func (e *javaExport) generic(_ any, ctx context.Context, dec func(any) error) (any, error) {
	var a Args
	if err := dec(&a); err != nil {
		return nil, err
	}
	if err := e.checkKey(ctx); err != nil {
		return nil, err
	}
	if len(a.Values) != 3 {
		return nil, badGeneric("a generic call has 3 arguments (method, parameter types, arguments), not %d", len(a.Values))
	}
	name, ok := a.Values[0].(string)
	if !ok {
		return nil, badGeneric("the method name of a generic call is a %T, not a string", a.Values[0])
	}
	types, typed, err := stringList(a.Values[1])
	if err != nil {
		return nil, badGeneric("the parameter types of a generic call: %v", err)
	}
	args, err := anyList(a.Values[2])
	if err != nil {
		return nil, badGeneric("the arguments of a generic call: %v", err)
	}
	m, err := e.resolve(strings.TrimSpace(name), types, typed)
	if err != nil {
		return nil, err
	}
	if args == nil {
		args = make([]any, len(m.params))
	}
	if len(args) != len(m.params) {
		return nil, badGeneric("%d arguments for %s(%s)", len(args), m.java, strings.Join(m.types, ", "))
	}
	vals := make([]reflect.Value, len(args))
	for i, p := range m.params {
		v, err := convert(args[i], p)
		if err != nil {
			return nil, badArgument(m, i, err)
		}
		vals[i] = v
	}
	return e.call(ctx, m, vals, true)
}

// resolve finds the method of a generic call as Java's GenericFilter
// does: by name and the given types, or by name alone when no types are
// given (typed false) and the name is unique. An empty list of types is
// given types: the method without parameters.
func (e *javaExport) resolve(name string, types []string, typed bool) (*method, error) {
	overloads := e.byName[name]
	if !typed {
		switch len(overloads) {
		case 0:
			return nil, e.noSuchMethod(name)
		case 1:
			return overloads[0], nil
		}
		return nil, badGeneric("Not unique method for method name(%s) in class(%s), find %d methods.", name, e.iface, len(overloads))
	}
	for _, m := range overloads {
		if len(m.types) != len(types) {
			continue
		}
		same := true
		for i, t := range types {
			if javaTypeName(strings.TrimSpace(t)) != m.types[i] {
				same = false
				break
			}
		}
		if same {
			return m, nil
		}
	}
	return nil, e.noSuchMethod(fmt.Sprintf("%s(%s)", name, strings.Join(types, ", ")))
}

// echo serves $echo, Java's EchoFilter: the one argument comes back.
func (e *javaExport) echo(_ any, ctx context.Context, dec func(any) error) (any, error) {
	var a Args
	if err := dec(&a); err != nil {
		return nil, err
	}
	if len(a.Values) != 1 {
		return nil, badGeneric("$echo has 1 argument, not %d", len(a.Values))
	}
	r := &Response{Value: a.Values[0]}
	if SupportsResponseAttachments(dabb.Attachments(ctx)[AttachDubboVersion]) {
		r.Attachments = map[string]any{AttachDubboVersion: DubboVersion}
	}
	return r, nil
}

// badGeneric is the error of a generic call whose arguments are not what
// the call needs: a bad request, answered 40.
func badGeneric(format string, args ...any) error {
	return &protocol.Error{Status: protocol.StatusBadRequest, Msg: fmt.Sprintf(format, args...)}
}

// stringList reads the parameter types of a generic call: null (typed
// false), or a list of strings.
func stringList(v any) (list []string, typed bool, err error) {
	if v == nil {
		return nil, false, nil
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice {
		return nil, false, fmt.Errorf("a %T, not a list of strings", v)
	}
	list = make([]string, rv.Len())
	for i := range list {
		s, ok := rv.Index(i).Interface().(string)
		if !ok {
			return nil, false, fmt.Errorf("type %d is a %T, not a string", i, rv.Index(i).Interface())
		}
		list[i] = s
	}
	return list, true, nil
}

// anyList reads the arguments of a generic call: null, or a list.
func anyList(v any) ([]any, error) {
	if v == nil {
		return nil, nil
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice || rv.Type() == bytesType {
		return nil, fmt.Errorf("a %T, not a list", v)
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out, nil
}
