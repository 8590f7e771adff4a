// ClientMiddleware: a client span per call, its trace context sent, its retries and hedges as events.

package oteldabb

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// ClientMiddleware returns a proxy.Middleware that traces each call. It
// starts a client span, a child of the span in the call's ctx if any, and
// injects its context into the call's attachments, so every attempt
// carries it. Each attempt after the first becomes an event on the span
// (see the package doc). The span ends when the call returns. Give it to
// proxy.WithMiddleware first, so that its span covers the other
// middlewares.
func ClientMiddleware(opts ...Option) proxy.Middleware {
	cfg, tracer := newConfig(opts)
	return func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			ctx, span := tracer.Start(ctx, call.Service+"/"+call.Method,
				trace.WithSpanKind(trace.SpanKindClient),
				trace.WithAttributes(callAttributes(call.Service, call.Method)...))
			cfg.propagator.Inject(ctx, callCarrier{call})
			if span.IsRecording() {
				prev := call.OnAttempt
				call.OnAttempt = func(a proxy.AttemptInfo) {
					if prev != nil {
						prev(a)
					}
					attemptEvent(span, a)
				}
			}
			err := next(ctx, call)
			span.SetAttributes(serverAddr(call.Addr)...)
			end(span, protocol.StatusOf(err), errorCode(err), err)
			return err
		}
	}
}

// attemptEvent records an attempt after the first as an event on span:
// "retry", or "hedge" for a hedged call's backup.
func attemptEvent(span trace.Span, a proxy.AttemptInfo) {
	if a.Attempt <= 1 {
		return
	}
	name := "retry"
	if a.Hedge {
		name = "hedge"
	}
	kv := append([]attribute.KeyValue{AttemptKey.Int(a.Attempt)}, serverAddr(a.Addr)...)
	if a.After != nil {
		kv = append(kv, StatusCodeKey.Int(int(protocol.StatusOf(a.After))))
	}
	span.AddEvent(name, trace.WithAttributes(kv...))
}
