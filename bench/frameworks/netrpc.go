package frameworks

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/rpc"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// NetRPC is Go's net/rpc as it comes: one rpc.Client (one connection), its
// default gob codec carrying the same message struct.
func NetRPC() Framework {
	return Framework{
		Name:  "netrpc",
		Setup: "net/rpc (Go std), one rpc.Client (1 conn), gob (its default codec)",
		Serve: serveNetRPC,
		Dial:  dialNetRPC,
	}
}

// NetRPCEcho is the net/rpc service; net/rpc finds its methods by
// reflection.
type NetRPCEcho struct{}

// Echo answers the workload.
func (NetRPCEcho) Echo(req, reply *benchpb.BenchmarkMessage) error {
	benchpb.CopyTo(reply, req)
	benchpb.Answer(reply)
	return nil
}

type netrpcServer struct {
	l    net.Listener
	done chan struct{}
}

func serveNetRPC(l net.Listener) (io.Closer, error) {
	srv := rpc.NewServer()
	if err := srv.RegisterName("Echo", NetRPCEcho{}); err != nil {
		return nil, fmt.Errorf("frameworks: netrpc: register: %w", err)
	}
	s := &netrpcServer{l: l, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go srv.ServeConn(conn)
		}
	}()
	return s, nil
}

// Close stops accepting; connections end when their clients close them.
func (s *netrpcServer) Close() error {
	err := s.l.Close()
	<-s.done
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

type netrpcClient struct{ c *rpc.Client }

func dialNetRPC(addr string) (Client, error) {
	c, err := rpc.Dial("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("frameworks: netrpc: dial %s: %w", addr, err)
	}
	return &netrpcClient{c: c}, nil
}

func (c *netrpcClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	reply := new(benchpb.BenchmarkMessage)
	call := c.c.Go("Echo.Echo", req, reply, make(chan *rpc.Call, 1))
	select {
	case <-call.Done:
		if call.Error != nil {
			return nil, call.Error
		}
		return reply, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (c *netrpcClient) Close() error { return c.c.Close() }
