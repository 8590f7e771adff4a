package oteldabb_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/oteldabb"
	"github.com/dabbrpc/dabb/proxy"
)

func attrString(k, v string) attribute.KeyValue    { return attribute.String(k, v) }
func attrInt(k string, v int64) attribute.KeyValue { return attribute.Int64(k, v) }

// TestRetryEvent: a call whose first attempt finds nothing listening is
// retried on the live instance, and its span records the retry as an
// event naming the attempt, the instance and the failure's status.
func TestRetryEvent(t *testing.T) {
	tr := newTracing(t)
	live := serve(t, &serviceB, struct{}{})
	dead := deadAddr(t)
	c := newClient(t, "test.B", []string{live, dead}, proxy.WithBalancer(balancer.ConsistentHash),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}),
		proxy.WithMiddleware(oteldabb.ClientMiddleware(tr.opts...)))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// The hash balancer sends some keys to the dead instance first.
	var retried sdktrace.ReadOnlySpan
	for i := 0; i < 64 && retried == nil; i++ {
		if err := c.Invoke(ctx, "test.B", "Echo", &msg{Text: "x"}, new(msg), proxy.HashKey(fmt.Sprint("key-", i))); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		spans := tr.rec.Ended()
		last := spans[len(spans)-1]
		switch n := len(last.Events()); {
		case n == 1:
			retried = last
		case n > 1:
			t.Fatalf("call %d: %d events, want at most 1 retry", i, n)
		}
	}
	if retried == nil {
		t.Fatal("no key of 64 went to the dead instance first: the test proves nothing")
	}
	ev := retried.Events()[0]
	if ev.Name != "retry" {
		t.Errorf("event %q, want retry", ev.Name)
	}
	for _, w := range []attribute.KeyValue{
		oteldabb.AttemptKey.Int(2), attrString("server.address", "127.0.0.1"), attrInt("server.port", port(t, live)),
	} {
		if got, ok := attr(ev.Attributes, w.Key); !ok || got != w.Value {
			t.Errorf("retry event: %s = %v (present %v), want %v", w.Key, got.String(), ok, w.Value.String())
		}
	}
	if _, ok := attr(ev.Attributes, oteldabb.StatusCodeKey); !ok {
		t.Errorf("retry event has no %s: the failure it follows", oteldabb.StatusCodeKey)
	}
	wantAttrs(t, retried, attrInt("server.port", port(t, live)))
}

// TestHedgeEvent: a hedged call whose first attempt is slow sends a
// backup, and its span records it as a hedge event.
func TestHedgeEvent(t *testing.T) {
	tr := newTracing(t)
	slow, fast := serve(t, &serviceB, true), serve(t, &serviceB, false)
	c := newClient(t, "test.B", []string{slow, fast}, proxy.WithBalancer(balancer.ConsistentHash),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}),
		proxy.WithMiddleware(oteldabb.ClientMiddleware(tr.opts...)))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	var hedged sdktrace.ReadOnlySpan
	for i := 0; i < 64 && hedged == nil; i++ {
		var reply msg
		err := c.Invoke(ctx, "test.B", "Maybe", &msg{}, &reply, proxy.Idempotent(),
			proxy.Hedge(10*time.Millisecond), proxy.Timeout(5*time.Second), proxy.HashKey(fmt.Sprint("key-", i)))
		if err != nil || reply.Text != "fast" {
			t.Fatalf("call %d: %q, %v; want the fast instance's answer", i, reply.Text, err)
		}
		spans := tr.rec.Ended()
		if last := spans[len(spans)-1]; len(last.Events()) > 0 {
			hedged = last
		}
	}
	if hedged == nil {
		t.Fatal("no key of 64 went to the slow instance first: the test proves nothing")
	}
	if n := len(hedged.Events()); n != 1 {
		t.Fatalf("%d events, want 1 hedge", n)
	}
	ev := hedged.Events()[0]
	if ev.Name != "hedge" {
		t.Errorf("event %q, want hedge", ev.Name)
	}
	if got, ok := attr(ev.Attributes, oteldabb.AttemptKey); !ok || got.AsInt64() != 2 {
		t.Errorf("hedge event: %s = %v (present %v), want 2", oteldabb.AttemptKey, got.String(), ok)
	}
	if _, ok := attr(ev.Attributes, oteldabb.StatusCodeKey); ok {
		t.Errorf("hedge event has %s; a backup sent because the first was slow follows no failure", oteldabb.StatusCodeKey)
	}
}

// TestGlobalDefaults: with no options, the middleware and the interceptor
// use the global TracerProvider and propagator.
func TestGlobalDefaults(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(propagation.TraceContext{})

	addr := serve(t, &serviceB, struct{}{}, dabb.WithInterceptor(oteldabb.ServerInterceptor()))
	c := newClient(t, "test.B", []string{addr}, proxy.WithMiddleware(oteldabb.ClientMiddleware()))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if err := c.Invoke(ctx, "test.B", "Echo", &msg{Text: "x"}, new(msg)); err != nil {
		t.Fatalf("call: %v", err)
	}
	spans := rec.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans ended, want 2", len(spans))
	}
	client := spanNamed(t, spans, "test.B/Echo", trace.SpanKindClient)
	server := spanNamed(t, spans, "test.B/Echo", trace.SpanKindServer)
	if server.Parent().SpanID() != client.SpanContext().SpanID() || !server.Parent().IsRemote() {
		t.Errorf("server span's parent %v (remote %v), want the client span %v", server.Parent().SpanID(),
			server.Parent().IsRemote(), client.SpanContext().SpanID())
	}
}
