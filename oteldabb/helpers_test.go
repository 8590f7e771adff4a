// Helpers of the tests: two services, A relaying to B, served and called for real.

package oteldabb_test

import (
	"context"
	"log/slog"
	"net"
	"strconv"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dabbrpc/dabb"
	_ "github.com/dabbrpc/dabb/codec/json"
	"github.com/dabbrpc/dabb/internal/dabbtest"
	"github.com/dabbrpc/dabb/oteldabb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

const testTimeout = 10 * time.Second

var quiet = slog.New(slog.DiscardHandler)

// msg is the request and reply of both services (JSON codec).
type msg struct {
	Text string
	Next string // A.Relay: the method of B to call
}

// serviceB answers Echo with the text and the "tenant" baggage member
// it received, and fails Fail with a 60 of code not_found. Maybe answers
// at once, or, when the implementation is true, not before its ctx ends.
var serviceB = dabb.ServiceDesc{Name: "test.B", Methods: []dabb.MethodDesc{
	{Name: "Echo", Handler: func(_ any, ctx context.Context, dec func(any) error) (any, error) {
		var req msg
		if err := dec(&req); err != nil {
			return nil, err
		}
		return &msg{Text: req.Text + " " + baggage.FromContext(ctx).Member("tenant").Value()}, nil
	}},
	{Name: "Maybe", Handler: func(impl any, ctx context.Context, dec func(any) error) (any, error) {
		if slow, _ := impl.(bool); slow {
			<-ctx.Done() // until the call's other attempt wins
			return nil, ctx.Err()
		}
		return &msg{Text: "fast"}, nil
	}},
	{Name: "Fail", Handler: func(_ any, ctx context.Context, dec func(any) error) (any, error) {
		return nil, protocol.NewError(protocol.StatusServiceNotFound, "not_found", "no such thing")
	}},
}}

// serviceA's Relay calls B's method req.Next with its own ctx, through
// the client it is registered with.
var serviceA = dabb.ServiceDesc{Name: "test.A", Methods: []dabb.MethodDesc{
	{Name: "Relay", Handler: func(impl any, ctx context.Context, dec func(any) error) (any, error) {
		var req msg
		if err := dec(&req); err != nil {
			return nil, err
		}
		out := new(msg)
		if err := impl.(*proxy.Client).Invoke(ctx, "test.B", req.Next, &msg{Text: req.Text}, out); err != nil {
			return nil, err
		}
		return out, nil
	}},
}}

// tracing is a TracerProvider that records spans in memory, and the
// options that give it and W3C propagation to the package.
type tracing struct {
	rec  *tracetest.SpanRecorder
	opts []oteldabb.Option
}

func newTracing(t *testing.T) *tracing {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	prop := propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	return &tracing{rec: rec, opts: []oteldabb.Option{oteldabb.WithTracerProvider(tp), oteldabb.WithPropagators(prop)}}
}

// serve serves desc with impl on loopback and returns its address; the
// server is closed when the test ends.
func serve(t *testing.T, desc *dabb.ServiceDesc, impl any, opts ...dabb.Option) string {
	t.Helper()
	s := dabb.NewServer(append([]dabb.Option{dabb.WithLogger(quiet)}, opts...)...)
	if err := s.RegisterService(desc, impl); err != nil {
		t.Fatal(err)
	}
	return dabbtest.Serve(t, s)
}

// newClient returns a JSON client of service at addrs, closed when the
// test ends.
func newClient(t *testing.T, service string, addrs []string, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	var ins []registry.Instance
	for _, a := range addrs {
		ins = append(ins, registry.Instance{Service: service, ID: a, Addr: a})
	}
	c, err := proxy.NewClient(static.New(ins...),
		append([]proxy.Option{proxy.WithLogger(quiet), proxy.WithCodec("json")}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// deadAddr returns a loopback address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func port(t *testing.T, addr string) int64 {
	t.Helper()
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(p)
	if err != nil {
		t.Fatal(err)
	}
	return int64(n)
}

// spanNamed returns the ended span of name and kind; it fails the test
// unless there is exactly one.
func spanNamed(t *testing.T, spans []sdktrace.ReadOnlySpan, name string, kind trace.SpanKind) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name && s.SpanKind() == kind {
			if found != nil {
				t.Fatalf("two %v spans named %q", kind, name)
			}
			found = s
		}
	}
	if found == nil {
		t.Fatalf("no %v span named %q among %d", kind, name, len(spans))
	}
	return found
}

// attr returns the value of key among kvs, and whether it is there.
func attr(kvs []attribute.KeyValue, key attribute.Key) (attribute.Value, bool) {
	for _, kv := range kvs {
		if kv.Key == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

// wantAttrs fails the test unless span has each of want.
func wantAttrs(t *testing.T, span sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	for _, w := range want {
		got, ok := attr(span.Attributes(), w.Key)
		switch {
		case !ok:
			t.Errorf("%v span %s: no %s, want %v", span.SpanKind(), span.Name(), w.Key, w.Value.String())
		case got != w.Value:
			t.Errorf("%v span %s: %s = %v, want %v", span.SpanKind(), span.Name(), w.Key, got.String(), w.Value.String())
		}
	}
}
