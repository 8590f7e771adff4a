// Client: typed calls of a Java interface's methods on Dubbo providers,
// declared as Service declares them, through a proxy.Client.

package dubbo

import (
	"context"
	"fmt"
	"reflect"
	"strings"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// SupportPackageIsVersion1 is referenced by the code rpcgen generates for
// a //dabb:dubbo interface, so that code stops compiling against a dubbo
// module too old for it.
const SupportPackageIsVersion1 = true

// Client calls the methods of a Java interface on its Dubbo providers in
// hessian2, typed, through a proxy.Client: its balancer, one budget per
// call (sent as the timeout attachment), retries of idempotent methods
// only, breakers and hedging. It is safe for concurrent use.
type Client struct {
	c          *proxy.Client
	key        serviceKey
	methods    map[string]*method // by Go name
	idempotent map[string]bool
}

// NewClient returns a client of the providers of javaInterface that c
// finds. Its methods are declared as Service declares them: decl is a Go
// interface, given as a nil pointer to it such as (*Greeter)(nil), or a
// value; each method of the form func(ctx context.Context, args...)
// (R, error) or func(ctx, args...) error is a Java method, its name and
// types as Service gives them, unless WithMethod says otherwise.
// WithVersion and WithGroup give the service key the client calls;
// WithIdempotent marks the methods the client may retry and hedge.
// Naming a method that decl does not declare is an error.
func NewClient(c *proxy.Client, javaInterface string, decl any, opts ...ServiceOption) (*Client, error) {
	var cfg serviceConfig
	for _, o := range opts {
		o(&cfg)
	}
	if c == nil {
		return nil, fmt.Errorf("dubbo: NewClient(%q): nil proxy.Client", javaInterface)
	}
	if !strings.Contains(javaInterface, ".") || !isClassName(javaInterface) {
		return nil, fmt.Errorf("dubbo: NewClient(%q): not a package-qualified Java interface name", javaInterface)
	}
	t := reflect.TypeOf(decl)
	if t == nil {
		return nil, fmt.Errorf("dubbo: NewClient(%q): nil declaration", javaInterface)
	}
	iface := t.Kind() == reflect.Pointer && t.Elem().Kind() == reflect.Interface
	if iface {
		t = t.Elem()
	}
	cl := &Client{c: c, key: serviceKey{iface: javaInterface, group: cfg.group, version: normVersion(cfg.version)},
		methods: map[string]*method{}, idempotent: cfg.idempotent}
	for i := range t.NumMethod() {
		sm := t.Method(i)
		mt := sm.Type
		if !iface {
			mt = reflect.ValueOf(decl).Method(i).Type() // without the receiver
		}
		m, err := methodOf(sm.Name, mt, cfg.methods)
		if err != nil {
			return nil, fmt.Errorf("dubbo: NewClient(%q): %w", javaInterface, err)
		}
		if m != nil {
			cl.methods[sm.Name] = m
			delete(cfg.methods, sm.Name)
		}
	}
	for goName := range cfg.methods {
		return nil, fmt.Errorf("dubbo: NewClient(%q): WithMethod(%q): %v has no method %s of the form func(context.Context, ...) (R, error)",
			javaInterface, goName, t, goName)
	}
	if len(cl.methods) == 0 {
		return nil, fmt.Errorf("dubbo: NewClient(%q): %v has no method of the form func(context.Context, ...) (R, error)", javaInterface, t)
	}
	for goName := range cfg.idempotent {
		// A misspelt name would leave the method without retries and
		// hedging, silently.
		if cl.methods[goName] == nil {
			return nil, fmt.Errorf("dubbo: NewClient(%q): WithIdempotent(%q): %v has no method %s of the form func(context.Context, ...) (R, error)",
				javaInterface, goName, t, goName)
		}
	}
	return cl, nil
}

// Call calls the Java method of the Go method goName with args, one per
// parameter after the context, and decodes the result into reply: a
// pointer to the method's Go result type, or nil to drop the result (of
// a void method, say). An argument is converted to its parameter's Go
// type as a Go assignment or numeric conversion would.
//
// A provider's exception is an error matching proxy.ErrServiceError whose
// cause is the *Exception (errors.As), as for Invoke; it is not retried
// and does not count against the breaker. Every error is a
// *protocol.Error.
func (cl *Client) Call(ctx context.Context, goName string, args []any, reply any, opts ...proxy.CallOption) error {
	m, ok := cl.methods[goName]
	if !ok {
		return protocol.NotSent(protocol.StatusClientError,
			fmt.Sprintf("dubbo: %s has no method %s declared", cl.key.iface, goName), nil)
	}
	vals, err := callArgs(m, args)
	if err != nil {
		return protocol.NotSent(protocol.StatusClientError, "dubbo: "+cl.key.iface+"."+m.java, err)
	}
	var out reflect.Value
	if reply != nil {
		out = reflect.ValueOf(reply)
		if out.Kind() != reflect.Pointer || out.IsNil() {
			return protocol.NotSent(protocol.StatusClientError,
				fmt.Sprintf("dubbo: %s.%s: the reply is a %T, not a non-nil pointer", cl.key.iface, m.java, reply), nil)
		}
	}
	all := []proxy.CallOption{proxy.Via(cl.key.colonKey()), proxy.UseCodec(Codec{}),
		proxy.Attachment(AttachInterface, cl.key.iface)}
	if cl.key.version != "" {
		all = append(all, proxy.Attachment(AttachVersion, cl.key.version))
	}
	if cl.key.group != "" {
		all = append(all, proxy.Attachment(AttachGroup, cl.key.group))
	}
	if cl.idempotent[goName] {
		all = append(all, proxy.Idempotent())
	}
	var resp Response
	req := &Args{Types: m.desc, Values: vals}
	if err := cl.c.Invoke(ctx, cl.key.iface, m.java, req, &resp, append(all, opts...)...); err != nil {
		return invokeError(err, cl.key.iface, m.java, m.types, typesGiven)
	}
	if reply == nil {
		return nil
	}
	v, err := convert(resp.Value, out.Elem().Type())
	if err != nil {
		return &protocol.Error{Status: protocol.StatusBadResponse, Remote: true,
			Msg: fmt.Sprintf("dubbo: the result of %s.%s does not fit a %v", cl.key.iface, m.java, out.Elem().Type()), Err: err}
	}
	out.Elem().Set(v)
	return nil
}

// callArgs converts args to m's parameter types and returns them as the
// codec writes them.
func callArgs(m *method, args []any) ([]any, error) {
	if len(args) != len(m.params) {
		return nil, fmt.Errorf("%d arguments for %s(%s)", len(args), m.java, strings.Join(m.types, ", "))
	}
	vals := make([]any, len(args))
	for i, p := range m.params {
		v, err := goArg(args[i], p)
		if err != nil {
			return nil, fmt.Errorf("argument %d of %s(%s): %w", i+1, m.java, strings.Join(m.types, ", "), err)
		}
		vals[i] = resultValue(v)
	}
	return vals, nil
}

// goArg returns a as a value of the Go type t: assigned, converted
// between numeric kinds when the value fits, or as convert reads a
// decoded value.
func goArg(a any, t reflect.Type) (reflect.Value, error) {
	if a == nil {
		return convert(nil, t)
	}
	rv := reflect.ValueOf(a)
	if rv.Type().AssignableTo(t) {
		out := reflect.New(t).Elem()
		out.Set(rv)
		return out, nil
	}
	if n, ok, err := integerArg(a); ok && err == nil && isInt(t.Kind()) && rv.Kind() != reflect.Float32 && rv.Kind() != reflect.Float64 {
		out := reflect.New(t).Elem()
		if out.OverflowInt(n) {
			return reflect.Value{}, fmt.Errorf("%d overflows a %v", n, t)
		}
		out.SetInt(n)
		return out, nil
	}
	return convert(a, t)
}

func isInt(k reflect.Kind) bool {
	switch k {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return true
	}
	return false
}
