package oteldabb_test

import (
	"context"
	"errors"
	"testing"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/oteldabb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// chain serves B, and A relaying to B, all traced; it returns a client of A.
func chain(t *testing.T, tr *tracing) (toA *proxy.Client, addrA, addrB string) {
	t.Helper()
	addrB = serve(t, &serviceB, struct{}{}, dabb.WithInterceptor(oteldabb.ServerInterceptor(tr.opts...)))
	toB := newClient(t, "test.B", []string{addrB}, proxy.WithMiddleware(oteldabb.ClientMiddleware(tr.opts...)))
	addrA = serve(t, &serviceA, toB, dabb.WithInterceptor(oteldabb.ServerInterceptor(tr.opts...)))
	toA = newClient(t, "test.A", []string{addrA}, proxy.WithMiddleware(oteldabb.ClientMiddleware(tr.opts...)))
	return toA, addrA, addrB
}

// TestTraceAcrossTwoServers: a client calls A, whose handler calls B. The
// four spans form one trace, each the child of the one before, and the
// baggage reaches B.
func TestTraceAcrossTwoServers(t *testing.T) {
	tr := newTracing(t)
	toA, addrA, addrB := chain(t, tr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	tenant, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		t.Fatal(err)
	}
	bag, err := baggage.New(tenant)
	if err != nil {
		t.Fatal(err)
	}
	var reply msg
	if err := toA.Invoke(baggage.ContextWithBaggage(ctx, bag), "test.A", "Relay", &msg{Text: "hi", Next: "Echo"}, &reply); err != nil {
		t.Fatalf("call: %v", err)
	}
	if reply.Text != "hi acme" {
		t.Errorf("reply %q, want %q: the baggage did not reach B", reply.Text, "hi acme")
	}

	spans := tr.rec.Ended()
	if len(spans) != 4 {
		t.Fatalf("%d spans ended, want 4", len(spans))
	}
	clientA := spanNamed(t, spans, "test.A/Relay", trace.SpanKindClient)
	serverA := spanNamed(t, spans, "test.A/Relay", trace.SpanKindServer)
	clientB := spanNamed(t, spans, "test.B/Echo", trace.SpanKindClient)
	serverB := spanNamed(t, spans, "test.B/Echo", trace.SpanKindServer)
	if clientA.Parent().IsValid() {
		t.Errorf("the first client span has parent %v, want none", clientA.Parent().SpanID())
	}
	for _, link := range []struct {
		child, parent string
		c, p          trace.SpanContext
		remote        bool
	}{
		{"server A", "client A", serverA.Parent(), clientA.SpanContext(), true},
		{"client B", "server A", clientB.Parent(), serverA.SpanContext(), false},
		{"server B", "client B", serverB.Parent(), clientB.SpanContext(), true},
	} {
		if link.c.TraceID() != link.p.TraceID() || link.c.SpanID() != link.p.SpanID() {
			t.Errorf("%s's parent is %v/%v, want %s, %v/%v", link.child, link.c.TraceID(), link.c.SpanID(),
				link.parent, link.p.TraceID(), link.p.SpanID())
		}
		if link.c.IsRemote() != link.remote {
			t.Errorf("%s's parent remote = %v, want %v", link.child, link.c.IsRemote(), link.remote)
		}
	}

	wantAttrs(t, clientB,
		attrString("rpc.system", "dabb"), attrString("rpc.service", "test.B"), attrString("rpc.method", "Echo"),
		attrString("server.address", "127.0.0.1"), attrInt("server.port", port(t, addrB)),
		oteldabb.StatusCodeKey.Int(int(protocol.StatusOK)))
	wantAttrs(t, serverA,
		attrString("rpc.system", "dabb"), attrString("rpc.service", "test.A"), attrString("rpc.method", "Relay"),
		attrString("server.address", "127.0.0.1"), attrInt("server.port", port(t, addrA)),
		attrString("client.address", "127.0.0.1"), oteldabb.StatusCodeKey.Int(int(protocol.StatusOK)))
	for _, s := range spans {
		if s.Status().Code != codes.Unset {
			t.Errorf("%v span %s has status %v, want unset after a success", s.SpanKind(), s.Name(), s.Status())
		}
	}
}

// TestErrorStatus: B fails with a 60 and a code; A passes a 70 up. Each
// span says its own status, with the code where it travels.
func TestErrorStatus(t *testing.T) {
	tr := newTracing(t)
	toA, _, _ := chain(t, tr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	err := toA.Invoke(ctx, "test.A", "Relay", &msg{Text: "hi", Next: "Fail"}, new(msg))
	if !errors.Is(err, proxy.ErrServiceError) {
		t.Fatalf("call: %v, want A's service error", err)
	}
	spans := tr.rec.Ended()
	for _, tc := range []struct {
		name   string
		kind   trace.SpanKind
		status protocol.Status
		code   string
	}{
		{"test.B/Fail", trace.SpanKindServer, protocol.StatusServiceNotFound, "not_found"},
		{"test.B/Fail", trace.SpanKindClient, protocol.StatusServiceNotFound, "not_found"},
		{"test.A/Relay", trace.SpanKindServer, protocol.StatusServiceError, ""},
		{"test.A/Relay", trace.SpanKindClient, protocol.StatusServiceError, ""},
	} {
		s := spanNamed(t, spans, tc.name, tc.kind)
		if s.Status().Code != codes.Error || s.Status().Description == "" {
			t.Errorf("%v span %s: status %v, want Error with the error's text", tc.kind, tc.name, s.Status())
		}
		wantAttrs(t, s, oteldabb.StatusCodeKey.Int(int(tc.status)))
		code, ok := attr(s.Attributes(), oteldabb.ErrorCodeKey)
		switch {
		case tc.code == "" && ok:
			t.Errorf("%v span %s: error code %q, want none (a downstream's code does not travel)", tc.kind, tc.name, code.AsString())
		case tc.code != "" && code.AsString() != tc.code:
			t.Errorf("%v span %s: error code %q, want %q", tc.kind, tc.name, code.AsString(), tc.code)
		}
	}
}
