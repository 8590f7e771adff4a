package frameworks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/bench/echo"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// Dabb is dabb as a user gets it: a method with no directives (Say: not
// idempotent, so each call carries an idempotency key, under the default
// 1 s budget), the rpcgen stub over proxy.Client on its defaults (a static
// registry of one address, two multiplexed connections), protobuf codec.
func Dabb() Framework {
	return Framework{
		Name:  "dabb",
		Setup: "dabb (this repo), a method with no directives (not idempotent: an idempotency key per call; the default 1 s budget), rpcgen stub, proxy.Client defaults (2 multiplexed conns; requests of 64 KiB or more on a third, one at a time beside small calls, paced while small calls are in flight to a share of the time that adapts to keep their p99 near 2.5× its value without them), protobuf",
		Serve: func(l net.Listener) (io.Closer, error) { return serveDabb(l) },
		Dial:  func(addr string) (Client, error) { return dialDabb(addr, false) },
	}
}

// DabbIdempotent is Dabb calling Echo, the method declared
// //dabb:idempotent and //dabb:timeout 30s: no idempotency key.
func DabbIdempotent() Framework {
	return Framework{
		Name:  "dabb-idem",
		Setup: "dabb's setup calling a method declared //dabb:idempotent and //dabb:timeout 30s: no idempotency key, retries allowed, a 30 s budget",
		Serve: func(l net.Listener) (io.Closer, error) { return serveDabb(l) },
		Dial:  func(addr string) (Client, error) { return dialDabb(addr, true) },
	}
}

// DabbTLS is Dabb over TLS 1.3: dabb.WithTLS on the server, proxy.WithTLS
// on the client, the run's certificate (see TLSEnv).
func DabbTLS() Framework {
	return Framework{
		Name:  "dabb-tls",
		Setup: "dabb's setup over TLS 1.3: dabb.WithTLS and proxy.WithTLS, an ECDSA P-256 certificate from a CA made at start, crypto/tls defaults otherwise",
		TLS:   true,
		Serve: func(l net.Listener) (io.Closer, error) {
			cfg, err := serverTLS()
			if err != nil {
				return nil, err
			}
			return serveDabb(l, dabb.WithTLS(cfg))
		},
		Dial: func(addr string) (Client, error) {
			cfg, err := clientTLS()
			if err != nil {
				return nil, err
			}
			return dialDabb(addr, false, proxy.WithTLS(cfg))
		},
	}
}

type dabbServer struct {
	srv  *dabb.Server
	done chan error
}

func serveDabb(l net.Listener, opts ...dabb.Option) (io.Closer, error) {
	srv := dabb.NewServer(append([]dabb.Option{dabb.WithLogger(quietLogger())}, opts...)...)
	if err := echo.RegisterEchoServer(srv, echo.Server{}); err != nil {
		return nil, fmt.Errorf("frameworks: dabb: %w", err)
	}
	s := &dabbServer{srv: srv, done: make(chan error, 1)}
	go func() { s.done <- srv.Serve(l) }()
	return s, nil
}

func (s *dabbServer) Close() error {
	err := s.srv.Close()
	if serr := <-s.done; serr != nil && !errors.Is(serr, dabb.ErrServerClosed) && err == nil {
		err = serr
	}
	return err
}

type dabbClient struct {
	c    *proxy.Client
	stub echo.Echo
	idem bool // call Echo (idempotent) rather than Say
}

func dialDabb(addr string, idempotent bool, opts ...proxy.Option) (Client, error) {
	c, err := proxy.NewClient(static.New(registry.Instance{Addr: addr}), append([]proxy.Option{proxy.WithLogger(quietLogger())}, opts...)...)
	if err != nil {
		return nil, err
	}
	return &dabbClient{c: c, stub: echo.NewEchoClient(c), idem: idempotent}, nil
}

func (c *dabbClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	if c.idem {
		return c.stub.Echo(ctx, req)
	}
	return c.stub.Say(ctx, req)
}

func (c *dabbClient) Close() error { return c.c.Close() }

// quietLogger logs warnings and errors to the default handler.
func quietLogger() *slog.Logger {
	return slog.New(&levelHandler{slog.LevelWarn, slog.Default().Handler()})
}

type levelHandler struct {
	min slog.Level
	slog.Handler
}

func (h *levelHandler) Enabled(_ context.Context, l slog.Level) bool { return l >= h.min }
