// Package echo is the benchmark workload as a dabb service: one method,
// Echo, whose client stub and server glue rpcgen writes into echo_dabb.go.
//
//	echo.RegisterEchoServer(srv, echo.Server{})         // server
//	reply, err := echo.NewEchoClient(client).Echo(ctx, req) // client
package echo

import (
	"context"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type Echo

// Echo is the benchmark's contract.
//
//dabb:service bench.Echo
type Echo interface {
	// Echo answers req with field1 = "OK", field2 = 100 and every other
	// field echoed. It is idempotent, as an echo is, so calls carry no
	// idempotency key, as calls of the other frameworks carry none. The
	// timeout is long so that a loaded machine measures latency instead of
	// failing calls.
	//dabb:idempotent
	//dabb:timeout 30s
	Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error)

	// Deliver is Echo declared not idempotent: the client gives each of
	// its calls an idempotency key. The in-process benchmarks use it to
	// show what the key costs.
	//dabb:timeout 30s
	Deliver(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error)

	// Say is Echo declared as a user's method is by default: no
	// directives. It is not idempotent, so each call carries an
	// idempotency key, and it runs under the client's default budget
	// (1 s). The headline dabb row of bench/ calls it.
	Say(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error)
}

// Server implements Echo: it answers the request in place and returns it.
type Server struct{}

// Echo implements Echo.
func (Server) Echo(_ context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	benchpb.Answer(req)
	return req, nil
}

// Deliver implements Echo.
func (Server) Deliver(_ context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	benchpb.Answer(req)
	return req, nil
}

// Say implements Echo.
func (Server) Say(_ context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	benchpb.Answer(req)
	return req, nil
}
