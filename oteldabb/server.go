// ServerInterceptor: a server span per call, a child of the caller's.

package oteldabb

import (
	"context"
	"errors"

	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/protocol"
)

// ServerInterceptor returns a dabb.Interceptor that traces each call. It
// extracts the caller's trace context and baggage from the request's
// attachments and starts a server span, the caller's span its remote
// parent. The handler's ctx carries the span and the baggage, so calls it
// makes with ctx continue the trace. The span ends when the call returns,
// before its reply is written. Give it to dabb.WithInterceptor first, so
// that its span covers the other interceptors.
func ServerInterceptor(opts ...Option) dabb.Interceptor {
	cfg, tracer := newConfig(opts)
	return func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		if info.Attachments != nil {
			ctx = cfg.propagator.Extract(ctx, attachmentsCarrier(info.Attachments))
		}
		attrs := callAttributes(info.Service, info.Method)
		if p, ok := dabb.RemotePeer(ctx); ok {
			if p.LocalAddr != nil {
				attrs = append(attrs, serverAddr(p.LocalAddr.String())...)
			}
			if p.RemoteAddr != nil {
				attrs = append(attrs, hostPort(p.RemoteAddr.String(), semconv.ClientAddress, semconv.ClientPort)...)
			}
		}
		ctx, span := tracer.Start(ctx, info.Service+"/"+info.Method,
			trace.WithSpanKind(trace.SpanKindServer), trace.WithAttributes(attrs...))
		reply, err := next(ctx)
		end(span, dabb.StatusOf(err), localCode(err), err)
		return reply, err
	}
}

// localCode is the code the server sends with err: that of a local
// *protocol.Error. A downstream's code does not travel.
func localCode(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) && !pe.Remote {
		return pe.Code
	}
	return ""
}
