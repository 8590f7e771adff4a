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

// Dabb is dabb on its defaults: the rpcgen stub over proxy.Client (a static
// registry of one address, two multiplexed connections), protobuf codec.
func Dabb() Framework {
	return Framework{
		Name:  "dabb",
		Setup: "dabb (this repo), rpcgen stub, proxy.Client defaults (2 multiplexed conns; requests of 64 KiB or more on a third, one at a time, paced to a quarter of the time while small calls are in flight), protobuf",
		Serve: serveDabb,
		Dial:  dialDabb,
	}
}

type dabbServer struct {
	srv  *dabb.Server
	done chan error
}

func serveDabb(l net.Listener) (io.Closer, error) {
	srv := dabb.NewServer(dabb.WithLogger(quietLogger()))
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
}

func dialDabb(addr string) (Client, error) {
	c, err := proxy.NewClient(static.New(registry.Instance{Addr: addr}), proxy.WithLogger(quietLogger()))
	if err != nil {
		return nil, err
	}
	return &dabbClient{c: c, stub: echo.NewEchoClient(c)}, nil
}

func (c *dabbClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	return c.stub.Echo(ctx, req)
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
