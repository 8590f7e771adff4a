package frameworks

import (
	"context"
	"fmt"
	"io"
	"net"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// GRPC is gRPC-Go v1.85.0 on its defaults: one grpc.ClientConn (one HTTP/2
// connection), protobuf, no TLS.
func GRPC() Framework {
	return Framework{
		Name:  "grpc",
		Setup: "google.golang.org/grpc v1.85.0, one ClientConn (1 HTTP/2 conn), protobuf, insecure",
		Serve: func(l net.Listener) (io.Closer, error) { return serveGRPC(l) },
		Dial:  func(addr string) (Client, error) { return dialGRPC(addr, insecure.NewCredentials()) },
	}
}

// GRPCTLS is GRPC over TLS 1.3: credentials.NewTLS on both sides, the run's
// certificate (see TLSEnv).
func GRPCTLS() Framework {
	return Framework{
		Name:  "grpc-tls",
		Setup: "grpc's setup over TLS 1.3: credentials.NewTLS on both sides, the certificate of dabb-tls, crypto/tls defaults otherwise",
		TLS:   true,
		Serve: func(l net.Listener) (io.Closer, error) {
			cfg, err := serverTLS()
			if err != nil {
				return nil, err
			}
			return serveGRPC(l, grpc.Creds(credentials.NewTLS(cfg)))
		},
		Dial: func(addr string) (Client, error) {
			cfg, err := clientTLS()
			if err != nil {
				return nil, err
			}
			return dialGRPC(addr, credentials.NewTLS(cfg))
		},
	}
}

type grpcEcho struct {
	benchpb.UnimplementedEchoServer
}

func (grpcEcho) Echo(_ context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	benchpb.Answer(req)
	return req, nil
}

type grpcServer struct {
	srv  *grpc.Server
	done chan error
}

func serveGRPC(l net.Listener, opts ...grpc.ServerOption) (io.Closer, error) {
	srv := grpc.NewServer(opts...)
	benchpb.RegisterEchoServer(srv, grpcEcho{})
	s := &grpcServer{srv: srv, done: make(chan error, 1)}
	go func() { s.done <- srv.Serve(l) }()
	return s, nil
}

func (s *grpcServer) Close() error {
	s.srv.Stop()
	return <-s.done
}

type grpcClient struct {
	cc   *grpc.ClientConn
	stub benchpb.EchoClient
}

func dialGRPC(addr string, creds credentials.TransportCredentials) (Client, error) {
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	if err != nil {
		return nil, fmt.Errorf("frameworks: grpc: dial %s: %w", addr, err)
	}
	return &grpcClient{cc: cc, stub: benchpb.NewEchoClient(cc)}, nil
}

func (c *grpcClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	return c.stub.Echo(ctx, req)
}

func (c *grpcClient) Close() error { return c.cc.Close() }
