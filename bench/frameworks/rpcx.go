package frameworks

import (
	"context"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"os"

	"github.com/smallnest/rpcx/client"
	rpcxlog "github.com/smallnest/rpcx/log"
	"github.com/smallnest/rpcx/protocol"
	"github.com/smallnest/rpcx/server"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// RPCX is rpcx v1.9.1 on its defaults but for the serialization: one
// client.Client (one connection), protobuf instead of msgpack.
func RPCX() Framework {
	return Framework{
		Name:  "rpcx",
		Setup: "github.com/smallnest/rpcx v1.9.1, one client.Client (1 conn), SerializeType ProtoBuffer",
		Serve: serveRPCX,
		Dial:  dialRPCX,
	}
}

func init() {
	// rpcx logs to stdout by default, which the bench's server process
	// uses to talk to its parent.
	rpcxlog.SetLogger(rpcxlog.NewDefaultLogger(os.Stderr, "rpcx ", stdlog.LstdFlags, rpcxlog.LvError))
}

// RPCXEcho is the rpcx service; rpcx finds its methods by reflection.
type RPCXEcho struct{}

// Echo answers the workload.
func (RPCXEcho) Echo(_ context.Context, req, reply *benchpb.BenchmarkMessage) error {
	benchpb.CopyTo(reply, req)
	benchpb.Answer(reply)
	return nil
}

type rpcxServer struct {
	srv  *server.Server
	done chan error
}

func serveRPCX(l net.Listener) (io.Closer, error) {
	srv := server.NewServer()
	if err := srv.RegisterName("Echo", RPCXEcho{}, ""); err != nil {
		return nil, fmt.Errorf("frameworks: rpcx: register: %w", err)
	}
	s := &rpcxServer{srv: srv, done: make(chan error, 1)}
	go func() { s.done <- srv.ServeListener("tcp", l) }()
	return s, nil
}

func (s *rpcxServer) Close() error {
	err := s.srv.Close()
	<-s.done // after Close, Serve returns one of several "closed" errors
	return err
}

type rpcxClient struct{ c *client.Client }

func dialRPCX(addr string) (Client, error) {
	opt := client.DefaultOption
	opt.SerializeType = protocol.ProtoBuffer
	c := client.NewClient(opt)
	if err := c.Connect("tcp", addr); err != nil {
		return nil, fmt.Errorf("frameworks: rpcx: dial %s: %w", addr, err)
	}
	return &rpcxClient{c: c}, nil
}

func (c *rpcxClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	reply := new(benchpb.BenchmarkMessage)
	if err := c.c.Call(ctx, "Echo", "Echo", req, reply); err != nil {
		return nil, err
	}
	return reply, nil
}

func (c *rpcxClient) Close() error { return c.c.Close() }
