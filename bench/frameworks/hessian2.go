package frameworks

import (
	"context"
	"fmt"
	"io"
	"net"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/bench/dubboecho"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// DabbHessian2 is dabb speaking Dubbo's hessian2 bodies with the dubbo
// module: the message as the POJO com.example.bench.BenchmarkMessage,
// served with dubbo.Service (the generated RegisterEchoServiceDubboServer)
// on a dabb.Server, called through the generated typed client over
// proxy.Client on a static registry, as the dabb row is.
func DabbHessian2() Framework {
	return Framework{
		Name:          "dabb-hessian2",
		Setup:         "dabb (this repo) with the dubbo module: Dubbo's hessian2 bodies, the message as a POJO (com.example.bench.BenchmarkMessage), dubbo.Service on a dabb.Server, the rpcgen Dubbo stub (a method declared //dabb:idempotent and //dabb:timeout 30s: no idempotency key) over proxy.Client defaults on a static registry",
		Serve:         serveDabbHessian2,
		Dial:          dialDabbHessian2,
		AdapterAllocs: "two allocations per call of the adapter's, not dabb's: the copies of the request and of the reply between benchpb's type and the POJO",
	}
}

func serveDabbHessian2(l net.Listener) (io.Closer, error) {
	srv := dabb.NewServer(dabb.WithLogger(quietLogger()))
	s := &dabbServer{srv: srv, done: make(chan error, 1)}
	if err := dubboecho.RegisterEchoServiceDubboServer(s.srv, dubboecho.Server{}); err != nil {
		return nil, fmt.Errorf("frameworks: dabb-hessian2: %w", err)
	}
	go func() { s.done <- s.srv.Serve(l) }()
	return s, nil
}

type dabbHessian2Client struct {
	c    *proxy.Client
	stub dubboecho.EchoService
}

func dialDabbHessian2(addr string) (Client, error) {
	c, err := proxy.NewClient(static.New(registry.Instance{Addr: addr}), proxy.WithLogger(quietLogger()))
	if err != nil {
		return nil, err
	}
	stub, err := dubboecho.NewEchoServiceDubboClient(c)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("frameworks: dabb-hessian2: %w", err)
	}
	return &dabbHessian2Client{c: c, stub: stub}, nil
}

// Echo copies req into the POJO, calls, and copies the reply back into
// benchpb's type (strings and slices shared).
func (c *dabbHessian2Client) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	reply, err := c.stub.Echo(ctx, dubboecho.FromProto(req))
	if err != nil {
		return nil, err
	}
	if reply == nil {
		return nil, fmt.Errorf("%w: null", benchpb.ErrBadReply)
	}
	return reply.Proto(), nil
}

func (c *dabbHessian2Client) Close() error { return c.c.Close() }
