// Service: a Go value served as a Java interface to Dubbo consumers, its
// methods found by reflection and called from hessian2 requests.

package dubbo

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/protocol"
)

// ServiceOption configures Service.
type ServiceOption func(*serviceConfig)

type serviceConfig struct {
	methods                     map[string]methodOption // by Go name
	version, group, application string
	idempotent                  map[string]bool // by Go name; read by NewClient
}

type methodOption struct {
	java  string
	types []string
}

// WithMethod gives the Go method goName the Java name javaName and, when
// any are given, the Java parameter types (one per parameter after the
// context, such as "int" or "com.example.inventory.DeductRequest"). The
// default name is the Go name with a lower-case first letter; the default
// types are JavaType's. Two Go methods may take one Java name with
// different types: Java's overloads.
func WithMethod(goName, javaName string, javaTypes ...string) ServiceOption {
	return func(c *serviceConfig) {
		if c.methods == nil {
			c.methods = map[string]methodOption{}
		}
		c.methods[goName] = methodOption{java: javaName, types: javaTypes}
	}
}

// WithVersion sets the export's service version; default none. Calls that
// ask for another version are answered as Java answers an unknown service.
func WithVersion(v string) ServiceOption { return func(c *serviceConfig) { c.version = v } }

// WithGroup sets the export's service group; default none. Calls that ask
// for another group are answered as Java answers an unknown service.
func WithGroup(g string) ServiceOption { return func(c *serviceConfig) { c.group = g } }

// WithIdempotent marks the Go methods goNames as safe to run more than
// once: a Client retries and hedges their calls as proxy.Idempotent
// allows. Default none. Service ignores it.
func WithIdempotent(goNames ...string) ServiceOption {
	return func(c *serviceConfig) {
		if c.idempotent == nil {
			c.idempotent = map[string]bool{}
		}
		for _, n := range goNames {
			c.idempotent[n] = true
		}
	}
}

// WithApplication names the application in the published provider node;
// default the program's file name.
func WithApplication(name string) ServiceOption {
	return func(c *serviceConfig) { c.application = name }
}

// Service describes impl as the Java interface javaInterface, ready for
// dabb's Server.RegisterService(desc, impl). Every exported method of
// impl of the form
//
//	func(ctx context.Context, args...) (R, error)
//	func(ctx context.Context, args...) error // a void Java method
//
// is a Java method: its name is the Go name with a lower-case first
// letter, its parameter and result types those JavaType gives (int64
// long, int32 int, string java.lang.String, a pointer to a struct
// registered with RegisterPOJO its class), unless WithMethod says
// otherwise. Other methods are left out. The handlers call impl itself:
// register the description with the same impl.
//
// The description's Metadata makes the zookeeper:// registry publish the
// export in Dubbo's layout: MetaMethods and MetaSignatures (its service
// definition), and MetaVersion, MetaGroup and MetaApplication when set. Its methods are also served to generic calls
// ($invoke, $invokeAsync) and to Java's echo ($echo). They read hessian2
// payloads only: the service answers calls in serialization id 2.
//
// A handler's error reaches the consumer as a Java exception: an error
// that is an *Exception as that exception; a local *protocol.Error of
// dabb's bad-request class (errors.Is protocol.ErrBadRequest, or code
// protocol.CodeInvalidArgument) as java.lang.IllegalArgumentException;
// any other as java.lang.RuntimeException; the error's text is the
// message. A generic call's exception is wrapped in GenericException.
func Service(javaInterface string, impl any, opts ...ServiceOption) (*dabb.ServiceDesc, error) {
	var cfg serviceConfig
	for _, o := range opts {
		o(&cfg)
	}
	if !strings.Contains(javaInterface, ".") || !isClassName(javaInterface) {
		return nil, fmt.Errorf("dubbo: Service(%q): not a package-qualified Java interface name", javaInterface)
	}
	if impl == nil {
		return nil, fmt.Errorf("dubbo: Service(%q): nil implementation", javaInterface)
	}
	e := &javaExport{iface: javaInterface, version: normVersion(cfg.version), group: cfg.group, byName: map[string][]*method{}}
	v := reflect.ValueOf(impl)
	for i := range v.NumMethod() {
		m, err := newMethod(v.Type().Method(i).Name, v.Method(i), cfg.methods)
		if err != nil {
			return nil, fmt.Errorf("dubbo: Service(%q): %w", javaInterface, err)
		}
		if m == nil {
			continue
		}
		for _, o := range e.byName[m.java] {
			if o.desc == m.desc {
				return nil, fmt.Errorf("dubbo: Service(%q): %s and %s are both %s(%s)", javaInterface, o.goName, m.goName, m.java, strings.Join(m.types, ", "))
			}
		}
		e.byName[m.java] = append(e.byName[m.java], m)
		delete(cfg.methods, m.goName)
	}
	for goName := range cfg.methods {
		return nil, fmt.Errorf("dubbo: Service(%q): WithMethod(%q): %T has no method %s of the form func(context.Context, ...) (R, error)",
			javaInterface, goName, impl, goName)
	}
	if len(e.byName) == 0 {
		return nil, fmt.Errorf("dubbo: Service(%q): %T has no method of the form func(context.Context, ...) (R, error)", javaInterface, impl)
	}
	names := make([]string, 0, len(e.byName))
	for name := range e.byName {
		names = append(names, name)
	}
	slices.Sort(names)
	var sigs []string
	desc := &dabb.ServiceDesc{Name: javaInterface, Metadata: map[string]string{MetaMethods: strings.Join(names, ",")}}
	for _, name := range names {
		desc.Methods = append(desc.Methods, dabb.MethodDesc{Name: name, Handler: e.typed(e.byName[name])})
		for _, m := range e.byName[name] {
			sigs = append(sigs, m.signature())
		}
	}
	desc.Metadata[MetaSignatures] = strings.Join(sigs, ";")
	desc.Methods = append(desc.Methods,
		dabb.MethodDesc{Name: methodInvoke, Handler: e.generic},
		dabb.MethodDesc{Name: methodInvokeAsync, Handler: e.generic},
		dabb.MethodDesc{Name: methodEcho, Handler: e.echo})
	for k, v := range map[string]string{MetaVersion: cfg.version, MetaGroup: cfg.group, MetaApplication: cfg.application} {
		if v != "" {
			desc.Metadata[k] = v
		}
	}
	return desc, nil
}

// The methods every export answers besides its own, as Java's filters do.
const (
	methodInvoke      = "$invoke"
	methodInvokeAsync = "$invokeAsync"
	methodEcho        = "$echo"
)

var (
	contextType = reflect.TypeOf((*context.Context)(nil)).Elem()
	errorType   = reflect.TypeOf((*error)(nil)).Elem()
)

// javaExport is a Service's state: its key and its methods by Java name.
type javaExport struct {
	iface, version, group string
	byName                map[string][]*method
}

// method is one Java method bound to its Go method.
type method struct {
	goName, java string
	fn           reflect.Value
	params       []reflect.Type // after the context
	types        []string       // Java parameter types
	desc         string
	result       string // Java result type, "void" for none
}

// newMethod returns the Java method of the Go method fn named goName, or
// nil when fn is not of a served form and no option names it.
func newMethod(goName string, fn reflect.Value, opts map[string]methodOption) (*method, error) {
	m, err := methodOf(goName, fn.Type(), opts)
	if m != nil {
		m.fn = fn
	}
	return m, err
}

// methodOf returns the Java method of a Go method named goName of type t
// (without its receiver), unbound, or nil when t is not of a served form
// and no option names it.
func methodOf(goName string, t reflect.Type, opts map[string]methodOption) (*method, error) {
	opt, named := opts[goName]
	if t.NumIn() == 0 || t.In(0) != contextType || t.IsVariadic() ||
		t.NumOut() == 0 || t.NumOut() > 2 || t.Out(t.NumOut()-1) != errorType {
		if named {
			return nil, fmt.Errorf("WithMethod(%q): %s is %v, not of the form func(context.Context, ...) (R, error)", goName, goName, t)
		}
		return nil, nil
	}
	m := &method{goName: goName, java: lowerFirst(goName), result: "void"}
	if named && opt.java != "" {
		m.java = opt.java
	}
	if m.java == "" || strings.HasPrefix(m.java, "$") || strings.ContainsAny(m.java, " .,()") {
		return nil, fmt.Errorf("method %s: %q is not a Java method name", goName, m.java)
	}
	for i := 1; i < t.NumIn(); i++ {
		m.params = append(m.params, t.In(i))
	}
	if named && len(opt.types) > 0 {
		if len(opt.types) != len(m.params) {
			return nil, fmt.Errorf("WithMethod(%q): %d Java types for %d parameters", goName, len(opt.types), len(m.params))
		}
		m.types = slices.Clone(opt.types)
	} else {
		for i, p := range m.params {
			jt, err := JavaType(p)
			if err != nil {
				return nil, fmt.Errorf("method %s, parameter %d: %w (give its Java type with WithMethod)", goName, i+1, err)
			}
			m.types = append(m.types, jt)
		}
	}
	desc, err := MakeDesc(m.types...)
	if err != nil {
		return nil, fmt.Errorf("method %s: %w", goName, err)
	}
	m.desc = desc
	if t.NumOut() == 2 {
		rt, err := JavaType(t.Out(0))
		if err != nil {
			return nil, fmt.Errorf("method %s, result: %w", goName, err)
		}
		m.result = rt
	}
	return m, nil
}

// lowerFirst returns s with a lower-case first letter.
func lowerFirst(s string) string {
	r, n := utf8.DecodeRuneInString(s)
	return string(unicode.ToLower(r)) + s[n:]
}

// normVersion reads Dubbo's "0.0.0" as no version, as Java's consumers of
// 2.6 write it.
func normVersion(v string) string {
	if v == "0.0.0" {
		return ""
	}
	return v
}

// typed is the handler of the Java method that overloads lists: it
// decodes the arguments, picks the overload by the descriptor and calls it.
func (e *javaExport) typed(overloads []*method) dabb.MethodHandler {
	return func(_ any, ctx context.Context, dec func(any) error) (any, error) {
		var a Args
		if err := dec(&a); err != nil {
			return nil, err
		}
		if err := e.checkKey(ctx); err != nil {
			return nil, err
		}
		var m *method
		for _, o := range overloads {
			if o.desc == a.Types {
				m = o
			}
		}
		if m == nil {
			return nil, e.noSuchMethod(fmt.Sprintf("%s(%s)", overloads[0].java, a.Types))
		}
		args := make([]reflect.Value, len(m.params))
		for i, p := range m.params {
			v, err := convert(a.Values[i], p)
			if err != nil {
				return nil, badArgument(m, i, err)
			}
			args[i] = v
		}
		return e.call(ctx, m, args, false)
	}
}

// checkKey refuses a call for another version or group than the export's,
// as Java finds no exported service for it.
func (e *javaExport) checkKey(ctx context.Context) error {
	att := dabb.Attachments(ctx)
	version, group := normVersion(att[AttachVersion]), att[AttachGroup]
	if version == e.version && group == e.group {
		return nil
	}
	key := e.iface
	if group != "" {
		key = group + "/" + key
	}
	if version != "" {
		key += ":" + version
	}
	return protocol.NewError(protocol.StatusServiceNotFound, protocol.CodeUnimplemented,
		"Not found exported service: "+key+", may be version or group mismatch")
}

// noSuchMethod is the error of a call that names no method of the export.
func (e *javaExport) noSuchMethod(what string) error {
	return protocol.NewError(protocol.StatusServiceNotFound, protocol.CodeUnimplemented,
		"No such method "+what+" in class "+e.iface)
}

// badArgument is the error of an argument that does not fit its Go type.
func badArgument(m *method, i int, err error) error {
	return &protocol.Error{Status: protocol.StatusBadRequest,
		Msg: fmt.Sprintf("argument %d of %s(%s): %v", i+1, m.java, strings.Join(m.types, ", "), err)}
}

// call runs m and makes its result a *Response, or its error a Java
// exception (wrapped in GenericException for a generic call).
func (e *javaExport) call(ctx context.Context, m *method, args []reflect.Value, generic bool) (any, error) {
	out := m.fn.Call(append([]reflect.Value{reflect.ValueOf(ctx)}, args...))
	if err := out[len(out)-1]; !err.IsNil() {
		return nil, newJavaError(err.Interface().(error), generic)
	}
	r := &Response{}
	if len(out) == 2 {
		if generic {
			r.Value = generalize(out[0])
		} else {
			r.Value = resultValue(out[0])
		}
	}
	if SupportsResponseAttachments(dabb.Attachments(ctx)[AttachDubboVersion]) {
		r.Attachments = map[string]any{AttachDubboVersion: DubboVersion}
	}
	return r, nil
}

// resultValue is a result as the codec encodes it: a nil pointer, slice,
// map or interface is Java's null.
func resultValue(v reflect.Value) any {
	switch v.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Slice, reflect.Map:
		if v.IsNil() {
			return nil
		}
	}
	return v.Interface()
}

// javaError is a handler's error as the Java exception a consumer gets.
// Its text is the exception's, "Class: message", which the format reads
// back; it unwraps to the handler's error.
type javaError struct {
	exc *Exception
	err error
}

func (e *javaError) Error() string { return e.exc.Error() }
func (e *javaError) Unwrap() error { return e.err }

// newJavaError maps a handler's error to its Java exception.
func newJavaError(err error, generic bool) error {
	var exc *Exception
	var pe *protocol.Error
	switch {
	case errors.As(err, &exc):
		exc = &Exception{Class: exc.Class, Message: exc.Message, WrappedClass: exc.WrappedClass, WrappedMessage: exc.WrappedMessage}
	case errors.As(err, &pe) && !pe.Remote && (errors.Is(pe, protocol.ErrBadRequest) || pe.Code == protocol.CodeInvalidArgument):
		exc = &Exception{Class: IllegalArgumentException, Message: errorText(err)}
	default:
		exc = &Exception{Class: RuntimeException, Message: errorText(err)}
	}
	if generic && exc.Class != GenericException {
		exc = NewGenericException(exc.Class, exc.Message)
	}
	return &javaError{exc: exc, err: err}
}

// errorText is an error's message for a Java consumer: a local
// *protocol.Error's own text without its status, which Java does not
// read; any other error's text.
func errorText(err error) string {
	pe, ok := err.(*protocol.Error)
	if !ok || pe.Remote {
		return err.Error()
	}
	s := pe.Msg
	if pe.Err != nil && pe.Err.Error() != pe.Msg {
		if s != "" {
			s += ": "
		}
		s += pe.Err.Error()
	}
	if s == "" {
		s = pe.Status.String()
	}
	return s
}
