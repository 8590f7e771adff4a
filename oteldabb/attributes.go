// The attributes of a span: the RPC conventions' and dabb's status and code.

package oteldabb

import (
	"errors"
	"net"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/dabbrpc/dabb/protocol"
)

// Keys of dabb's own attributes, named as the conventions name gRPC's
// (rpc.grpc.status_code) and Connect's (rpc.connect_rpc.error_code).
const (
	// StatusCodeKey is the Dubbo status of a call: 20 on success.
	StatusCodeKey = attribute.Key("rpc.dabb.status_code")
	// ErrorCodeKey is dabb's error code (protocol.Error.Code), when the
	// error carries one.
	ErrorCodeKey = attribute.Key("rpc.dabb.error_code")
	// AttemptKey is the number of an attempt, on a retry or hedge event.
	AttemptKey = attribute.Key("dabb.attempt")
)

// systemDabb is rpc.system for every span of this package.
var systemDabb = semconv.RPCSystemKey.String("dabb")

// callAttributes are the attributes every span of a call starts with.
func callAttributes(service, method string) []attribute.KeyValue {
	return []attribute.KeyValue{systemDabb, semconv.RPCService(service), semconv.RPCMethod(method)}
}

// hostPort splits addr into the attributes of its host and port, made by
// host and port. It returns none for an address that does not split.
func hostPort(addr string, host func(string) attribute.KeyValue, port func(int) attribute.KeyValue) []attribute.KeyValue {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil
	}
	kv := []attribute.KeyValue{host(h)}
	if n, err := strconv.Atoi(p); err == nil {
		kv = append(kv, port(n))
	}
	return kv
}

// serverAddr is server.address and server.port of addr.
func serverAddr(addr string) []attribute.KeyValue {
	return hostPort(addr, semconv.ServerAddress, semconv.ServerPort)
}

// end records the outcome of a call on span: its status, and for an
// error its code and text. status is what the call answered or got.
// code is the error's code, "" for none.
func end(span trace.Span, status protocol.Status, code string, err error) {
	span.SetAttributes(StatusCodeKey.Int(int(status)))
	if err != nil {
		if code != "" {
			span.SetAttributes(ErrorCodeKey.String(code))
		}
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// errorCode is the code of a *protocol.Error in err's chain, or "".
func errorCode(err error) string {
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}
