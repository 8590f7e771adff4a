// Package oteldabb traces dabb calls with OpenTelemetry: a client
// middleware and a server interceptor that make a span per call and carry
// the trace context, and baggage, in the request's attachments.
//
//	import (
//		"go.opentelemetry.io/otel"
//		"go.opentelemetry.io/otel/propagation"
//		"github.com/dabbrpc/dabb/oteldabb"
//	)
//
//	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
//		propagation.TraceContext{}, propagation.Baggage{}))
//	c, err := proxy.NewClient(reg, proxy.WithMiddleware(oteldabb.ClientMiddleware()))
//	s := dabb.NewServer(dabb.WithInterceptor(oteldabb.ServerInterceptor()))
//
// By default both use otel.GetTracerProvider() and
// otel.GetTextMapPropagator(); WithTracerProvider and WithPropagators
// give others. OpenTelemetry's global propagator propagates nothing until
// one is set, as above: W3C trace context travels under the attachments
// "traceparent" and "tracestate", baggage under "baggage".
//
// # Spans
//
// A span is named "<service>/<method>" ("inventory.Inventory/Deduct"),
// of kind client or server. The client's covers the whole call, all its
// attempts and the decoding of the reply; the server's covers the
// interceptors after it and the handler. Give the middleware and the
// interceptor first, so that they cover the rest. A handler that calls on
// with its ctx makes its calls' spans children of its own.
//
// Attributes, by OpenTelemetry's RPC semantic conventions (v1.37.0):
//
//	rpc.system            "dabb"
//	rpc.service           the service, "inventory.Inventory"
//	rpc.method            the method, "Deduct"
//	server.address        client: the instance of the attempt whose outcome
//	server.port           the call returns; server: the address it serves on
//	client.address        server only: the caller's address
//	client.port
//	rpc.dabb.status_code  the Dubbo status: 20 on success, else the error's
//	rpc.dabb.error_code   dabb's error code, when the error carries one
//
// A failed call sets the span's status to Error with the error's text.
//
// Each attempt after the first is an event on the client's span: "retry"
// for a retry, "hedge" for a hedged call's backup. Its attributes are
// dabb.attempt (its number, from 2), server.address and server.port (the
// instance it goes to) and, when it follows a failure,
// rpc.dabb.status_code (that failure's status).
package oteldabb
