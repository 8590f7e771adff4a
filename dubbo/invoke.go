// Invoke: Dubbo's generic call ($invoke) from Go without a stub, through a
// proxy.Client, with the parameter types given, read from the provider's
// service definition, or inferred.

package dubbo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	hessian "github.com/apache/dubbo-go-hessian2"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// Attachment keys and values of a generic call.
const (
	// MethodInvoke is the method name of Dubbo's generic call.
	MethodInvoke = "$invoke"
	// AttachGeneric says how a generic call's POJOs travel; Invoke sets
	// it to "true": as maps with their class under "class".
	AttachGeneric = "generic"
)

// invokeDesc is the descriptor of $invoke(String method, String[] types,
// Object[] args).
const invokeDesc = "Ljava/lang/String;[Ljava/lang/String;[Ljava/lang/Object;"

// ErrNoSuchMethod matches the error of Invoke when the provider found no
// method of that name and parameter types. Its message says which types
// were sent and, when they were inferred, to pass them.
var ErrNoSuchMethod = errors.New("dubbo: the provider has no such method")

// Invoke calls method of service with Dubbo's generic call ($invoke,
// generic=true) through c, so c's balancer, budget, retries and breakers
// apply. service is a Dubbo service key, [group/]interface[:version] or
// interface:version:group; the client balances over the instances its
// zookeeper:// registry lists for the key, named in the colon-separated
// form when it has a group (registry.Cache refuses a '/'). Each request
// carries path,
// interface, version, group and timeout (the budget left) as Java's
// consumer sends them.
//
// types are the Java parameter types, one per argument, such as
// "java.lang.String", "int" or "com.example.HelloRequest". A Java
// provider resolves the method by them exactly. When types is nil and c's
// registry is the zookeeper:// Registry, they come from the provider's
// service definition in Dubbo's metadata report: the one method of that
// name and argument count (see Registry.ServiceDefinitions). Several such
// methods of different types are an error matching ErrOverloaded. Without
// a definition, or when it cannot be read within a second, they are
// inferred from args: a string is java.lang.String, an integer long, a
// fraction double, a bool boolean, a slice java.util.List, and a map its
// "class" entry or java.util.Map. An integer given for int, short or byte
// travels as a hessian2 int.
//
// An argument is a Go string, integer, float, bool, nil, json.Number, a
// []any of arguments, a map[string]any of them (a POJO as a map of its
// fields with its class under "class"), or a struct registered with
// RegisterPOJO, which travels as that map.
//
// The result is what the provider returned, generalized: nil for null, a
// string, int32 for int, int64 for long, float64, bool, []any for a list
// or array, and map[string]any for a map or a POJO (with "class").
//
// A provider's exception is an error that matches proxy.ErrServiceError,
// whose cause is the *Exception (errors.As); one a generic call wraps in
// GenericException is unwrapped. Like Java's consumer, the call is not
// retried on it and it does not count against the instance's breaker.
// Every error is a *protocol.Error, as proxy.Client.Invoke's are.
func Invoke(ctx context.Context, c *proxy.Client, service, method string, types []string, args []any, opts ...proxy.CallOption) (any, error) {
	if c == nil {
		return nil, protocol.NotSent(protocol.StatusClientError, "dubbo: Invoke with a nil proxy.Client", nil)
	}
	key, err := parseServiceKey(service)
	if err != nil {
		return nil, protocol.NotSent(protocol.StatusClientError, "dubbo: Invoke", err)
	}
	if strings.Contains(key.group, ",") || key.group == "*" || key.version == "*" {
		return nil, protocol.NotSent(protocol.StatusClientError,
			fmt.Sprintf("dubbo: Invoke %q: a call names one group and one version, not a pattern", service), nil)
	}
	from := typesGiven
	if types == nil && method != "" && len(args) > 0 {
		if src, ok := c.Registry().(typeSource); ok {
			defined, err := src.definedTypes(ctx, key, method, len(args))
			if err != nil {
				return nil, protocol.NotSent(protocol.StatusClientError, "dubbo: Invoke "+key.iface+"."+method, err)
			}
			if defined != nil {
				types, from = defined, typesDefined
			}
		}
	}
	req, inferred, err := invokeArgs(method, types, args)
	if err != nil {
		return nil, protocol.NotSent(protocol.StatusClientError, "dubbo: Invoke "+key.iface+"."+method, err)
	}
	all := []proxy.CallOption{
		proxy.Via(key.colonKey()), proxy.UseCodec(Codec{}),
		proxy.Attachment(AttachGeneric, "true"), proxy.Attachment(AttachInterface, key.iface),
	}
	if key.version != "" {
		all = append(all, proxy.Attachment(AttachVersion, key.version))
	}
	if key.group != "" {
		all = append(all, proxy.Attachment(AttachGroup, key.group))
	}
	var resp Response
	if inferred {
		from = typesInferred
	}
	if err := c.Invoke(ctx, key.iface, MethodInvoke, req, &resp, append(all, opts...)...); err != nil {
		return nil, invokeError(err, key.iface, method, req.Values[1].([]string), from)
	}
	return plain(resp.Value), nil
}

// Where the parameter types of a generic call came from.
const (
	typesGiven    = "sent"
	typesDefined  = "from the provider's service definition"
	typesInferred = "inferred"
)

// invokeArgs builds the payload of $invoke: the method, the types (given
// or inferred) and the arguments as the types want them.
func invokeArgs(method string, types []string, args []any) (*Args, bool, error) {
	if method == "" {
		return nil, false, errors.New("no method name")
	}
	inferred := types == nil
	if inferred {
		types = make([]string, len(args))
		for i, a := range args {
			t, err := InferType(a)
			if err != nil {
				return nil, false, fmt.Errorf("argument %d: %w", i+1, err)
			}
			types[i] = t
		}
	}
	if len(types) != len(args) {
		return nil, false, fmt.Errorf("%d parameter types for %d arguments", len(types), len(args))
	}
	objs := make([]hessian.Object, len(args))
	for i, a := range args {
		if strings.TrimSpace(types[i]) == "" {
			return nil, false, fmt.Errorf("parameter type %d is empty", i+1)
		}
		v, err := wireValue(a, types[i])
		if err != nil {
			return nil, false, fmt.Errorf("argument %d: %w", i+1, err)
		}
		objs[i] = v
	}
	return &Args{Types: invokeDesc, Values: []any{method, types, objs}}, inferred, nil
}

// InferType returns the Java parameter type Invoke infers for an argument
// given without types: java.lang.String for a string, long for an integer
// (a json.Number without fraction or exponent included), double for a
// fraction, boolean for a bool, java.util.List for a slice, for a map
// its "class" entry, else java.util.Map, and for a struct registered with
// RegisterPOJO (or a pointer to one) its class. nil has no type: it is an
// error, as is any other Go type.
func InferType(v any) (string, error) {
	switch x := v.(type) {
	case nil:
		return "", errors.New("null has no type to infer; pass the parameter types")
	case string:
		return "java.lang.String", nil
	case bool:
		return "boolean", nil
	case json.Number:
		if _, err := x.Int64(); err == nil {
			return "long", nil
		}
		return "double", nil
	case map[string]any:
		if c, ok := x["class"].(string); ok && c != "" {
			return c, nil
		}
		return "java.util.Map", nil
	}
	t := reflect.TypeOf(v)
	if t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
		t = t.Elem()
	}
	if class, ok := pojos.Load(t); ok {
		return class.(string), nil
	}
	switch reflect.ValueOf(v).Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "long", nil
	case reflect.Float32, reflect.Float64:
		return "double", nil
	case reflect.Slice, reflect.Array:
		return "java.util.List", nil
	case reflect.Map:
		return "java.util.Map", nil
	}
	return "", fmt.Errorf("a %T has no Java type to infer; pass the parameter types", v)
}

// wireValue returns an argument as hessian2 should carry it for a
// parameter of javaType: numbers as the type's width, lists and maps
// element by element.
func wireValue(v any, javaType string) (any, error) {
	switch strings.TrimSpace(javaType) {
	case "int", "short", "byte", "java.lang.Integer", "java.lang.Short", "java.lang.Byte":
		if n, ok, err := integerArg(v); ok {
			if err != nil || n < math.MinInt32 || n > math.MaxInt32 {
				return nil, fmt.Errorf("%v is no %s", v, javaType)
			}
			return int32(n), nil
		}
	case "long", "java.lang.Long":
		if n, ok, err := integerArg(v); ok {
			if err != nil {
				return nil, fmt.Errorf("%v is no %s", v, javaType)
			}
			return n, nil
		}
	case "double", "float", "java.lang.Double", "java.lang.Float":
		if f, ok := floatArg(v); ok {
			return f, nil
		}
	}
	return plainArg(v)
}

// integerArg reads an integer argument; ok is false for a value of no
// numeric kind, err set for a number that is no integer of 64 bits.
func integerArg(v any) (n int64, ok bool, err error) {
	if num, isNum := v.(json.Number); isNum {
		n, err = strconv.ParseInt(string(num), 10, 64)
		return n, true, err
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return rv.Int(), true, nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		if u := rv.Uint(); u > math.MaxInt64 {
			return 0, true, fmt.Errorf("%d overflows a long", u)
		}
		return int64(rv.Uint()), true, nil
	case reflect.Float32, reflect.Float64:
		f := rv.Float()
		if f != math.Trunc(f) || math.Abs(f) > 1<<63 {
			return 0, true, fmt.Errorf("%g is no integer", f)
		}
		return int64(f), true, nil
	}
	return 0, false, nil
}

// floatArg reads a numeric argument as a float64.
func floatArg(v any) (float64, bool) {
	if num, ok := v.(json.Number); ok {
		f, err := num.Float64()
		return f, err == nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Float32, reflect.Float64:
		return rv.Float(), true
	}
	if n, ok, err := integerArg(v); ok && err == nil {
		return float64(n), true
	}
	return 0, false
}

// plainArg returns an argument of no declared width as hessian2 carries
// it: integers as long, floats as double, json.Number as either, slices as
// lists and maps with string keys element by element.
func plainArg(v any) (any, error) {
	switch x := v.(type) {
	case nil, string, bool, int32, int64, float64, []byte:
		return v, nil
	case json.Number:
		if n, err := x.Int64(); err == nil {
			return n, nil
		}
		f, err := x.Float64()
		if err != nil {
			return nil, fmt.Errorf("number %s: %w", x, err)
		}
		return f, nil
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			p, err := plainArg(e)
			if err != nil {
				return nil, fmt.Errorf("field %s: %w", k, err)
			}
			out[k] = p
		}
		return out, nil
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			p, err := plainArg(e)
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			out[i] = p
		}
		return out, nil
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		n, _, err := integerArg(v)
		return n, err
	case reflect.Float32:
		return rv.Float(), nil
	case reflect.Slice, reflect.Array:
		out := make([]any, rv.Len())
		for i := range out {
			p, err := plainArg(rv.Index(i).Interface())
			if err != nil {
				return nil, fmt.Errorf("element %d: %w", i, err)
			}
			out[i] = p
		}
		return out, nil
	}
	if t := rv.Type(); t.Kind() == reflect.Struct || t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Struct {
		if t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if _, ok := pojos.Load(t); ok {
			// A generic call carries a POJO as the map of its fields.
			return generalize(rv), nil
		}
	}
	// Other values the hessian2 library encodes (time.Time among them).
	return v, nil
}

// plain returns a decoded result with maps keyed by strings, as
// encoding/json prints them: map[any]any becomes map[string]any (keys
// formatted with %v), lists []any.
func plain(v any) any {
	switch x := v.(type) {
	case map[any]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[fmt.Sprint(k)] = plain(e)
		}
		return out
	case map[string]any:
		out := make(map[string]any, len(x))
		for k, e := range x {
			out[k] = plain(e)
		}
		return out
	case []any:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plain(e)
		}
		return out
	case []hessian.Object:
		out := make([]any, len(x))
		for i, e := range x {
			out[i] = plain(e)
		}
		return out
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() == reflect.Slice && rv.Type().Elem().Kind() != reflect.Uint8 {
		out := make([]any, rv.Len())
		for i := range out {
			out[i] = plain(rv.Index(i).Interface())
		}
		return out
	}
	if rv.Kind() == reflect.Pointer && !rv.IsNil() && rv.Elem().Kind() == reflect.Struct {
		return plain(generalize(rv))
	}
	return v
}

// invokeError gives the error of a generic call its Java exception as the
// cause, and says what to do about a missing method.
func invokeError(err error, iface, method string, types []string, from string) error {
	var pe *protocol.Error
	if !errors.As(err, &pe) || !pe.Remote {
		return err
	}
	out := *pe
	if exc := parseException(pe.Msg); exc != nil {
		if exc.Class == GenericException && exc.WrappedClass != "" {
			exc = &Exception{Class: exc.WrappedClass, Message: exc.WrappedMessage}
		}
		out.Msg, out.Err = exc.Error(), exc
	}
	if noSuchMethod(out.Msg) {
		hint := "check the method name and its Java parameter types"
		if from == typesInferred {
			hint = "pass the method's Java parameter types"
		}
		out.Msg = fmt.Sprintf("%s; no method %s.%s(%s) (types %s): %s", out.Msg, iface, method,
			strings.Join(types, ", "), from, hint)
		errs := []error{ErrNoSuchMethod}
		if out.Err != nil {
			errs = append(errs, out.Err)
		}
		out.Err = &causes{msg: out.Msg, errs: errs}
	}
	return &out
}

// causes carries the causes of an error whose message already says what
// they would: protocol.Error prints a cause whose text equals its message
// once.
type causes struct {
	msg  string
	errs []error
}

func (e *causes) Error() string   { return e.msg }
func (e *causes) Unwrap() []error { return e.errs }

// noSuchMethod says whether a provider's answer says it has no such
// method: Java's NoSuchMethodException and "No such method", dubbo-go's
// "method is not found".
func noSuchMethod(msg string) bool {
	return strings.Contains(msg, "NoSuchMethod") || strings.Contains(msg, "No such method") ||
		strings.Contains(msg, "method is not found") || strings.Contains(msg, "Not found method")
}

// MethodEcho is the method name of Dubbo's echo ($echo), which every
// provider answers with its one argument.
const MethodEcho = "$echo"

// Echo asks a provider of service (a service key, as for Invoke) whether
// it answers, with Dubbo's $echo: the provider returns the argument it
// was sent. It returns nil when the answer is that argument. Pass
// proxy.Timeout to bound it; c's timeout applies otherwise.
func Echo(ctx context.Context, c *proxy.Client, service string, opts ...proxy.CallOption) error {
	if c == nil {
		return protocol.NotSent(protocol.StatusClientError, "dubbo: Echo with a nil proxy.Client", nil)
	}
	key, err := parseServiceKey(service)
	if err != nil {
		return protocol.NotSent(protocol.StatusClientError, "dubbo: Echo", err)
	}
	all := []proxy.CallOption{proxy.Via(key.colonKey()), proxy.UseCodec(Codec{}),
		proxy.Attachment(AttachInterface, key.iface)}
	if key.version != "" {
		all = append(all, proxy.Attachment(AttachVersion, key.version))
	}
	if key.group != "" {
		all = append(all, proxy.Attachment(AttachGroup, key.group))
	}
	const ping = "OK"
	var resp Response
	req := &Args{Types: "Ljava/lang/Object;", Values: []any{ping}}
	if err := c.Invoke(ctx, key.iface, MethodEcho, req, &resp, append(all, opts...)...); err != nil {
		return err
	}
	if resp.Value != ping {
		return &protocol.Error{Status: protocol.StatusBadResponse, Remote: true,
			Msg: fmt.Sprintf("dubbo: $echo of %q answered %#v", ping, resp.Value)}
	}
	return nil
}
