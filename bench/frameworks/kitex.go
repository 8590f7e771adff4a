package frameworks

import (
	"context"
	"fmt"
	"io"
	"net"
	"sync"

	"github.com/cloudwego/kitex/client"
	"github.com/cloudwego/kitex/pkg/klog"
	"github.com/cloudwego/kitex/server"

	kbench "github.com/dabbrpc/dabb/bench/kitex_gen/benchpb"
	kecho "github.com/dabbrpc/dabb/bench/kitex_gen/benchpb/echo"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// Kitex is CloudWeGo Kitex v0.16.1 with its generated protobuf stubs (its
// own prutal codec) in mux mode: one multiplexed connection, the setup
// comparable with the others' one shared client. The messages are copied
// field by field between benchpb's type and Kitex's, strings shared.
func Kitex() Framework {
	return Framework{
		Name:  "kitex",
		Setup: "github.com/cloudwego/kitex v0.16.1, kitex-generated protobuf stubs (prutal), WithMuxConnection(1) / WithMuxTransport",
		Serve: serveKitex,
		Dial:  dialKitex,
		// netpoll writes with sendmsg (and reads with readv, which is
		// counted).
		UncountedWrites: true,
		// The Client interface returns benchpb's type, and the generated
		// EchoResult allocates its own message for every reply.
		AdapterAllocs: "one allocation per call made by the bench's adapter, not by Kitex: the reply copied from Kitex's generated type into benchpb's",
	}
}

// KitexPool is Kitex on its defaults: a client with its long-connection
// pool (one connection per call in flight, kept for reuse), a server
// without the mux transport. The stubs and the adapter are Kitex's.
func KitexPool() Framework {
	f := Kitex()
	f.Name = "kitex-pool"
	f.Setup = "github.com/cloudwego/kitex v0.16.1, kitex-generated protobuf stubs (prutal), its default client: the long-connection pool"
	f.Serve = func(l net.Listener) (io.Closer, error) { return serveKitexWith(l) }
	f.Dial = func(addr string) (Client, error) { return dialKitexWith(addr) }
	return f
}

func init() { klog.SetLevel(klog.LevelWarn) }

type kitexEcho struct{}

func (*kitexEcho) Echo(_ context.Context, req *kbench.BenchmarkMessage) (*kbench.BenchmarkMessage, error) {
	req.Field1 = "OK"
	req.Field2 = 100
	return req, nil
}

type kitexServer struct {
	srv  server.Server
	done chan error
}

func serveKitex(l net.Listener) (io.Closer, error) {
	return serveKitexWith(l, server.WithMuxTransport())
}

func serveKitexWith(l net.Listener, opts ...server.Option) (io.Closer, error) {
	opts = append([]server.Option{server.WithListener(l),
		server.WithExitSignal(func() <-chan error { return make(chan error) })}, opts...)
	srv := kecho.NewServer(&kitexEcho{}, opts...)
	s := &kitexServer{srv: srv, done: make(chan error, 1)}
	go func() { s.done <- srv.Run() }()
	return s, nil
}

func (s *kitexServer) Close() error {
	err := s.srv.Stop()
	<-s.done
	return err
}

type kitexClient struct {
	c    client.Client
	reqs sync.Pool // *kbench.BenchmarkMessage
}

// dialKitex makes the client the generated kecho.NewClient would, keeping
// the client.Client so that Close can close it.
func dialKitex(addr string) (Client, error) { return dialKitexWith(addr, client.WithMuxConnection(1)) }

func dialKitexWith(addr string, opts ...client.Option) (Client, error) {
	opts = append([]client.Option{client.WithDestService("bench.Echo"), client.WithHostPorts(addr)}, opts...)
	c, err := client.NewClient(kecho.NewServiceInfo(), opts...)
	if err != nil {
		return nil, fmt.Errorf("frameworks: kitex: dial %s: %w", addr, err)
	}
	k := &kitexClient{c: c}
	k.reqs.New = func() any { return new(kbench.BenchmarkMessage) }
	return k, nil
}

func (c *kitexClient) Echo(ctx context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	kreq := c.reqs.Get().(*kbench.BenchmarkMessage)
	toKitex(kreq, req)
	args, result := kecho.EchoArgs{Req: kreq}, kecho.EchoResult{}
	err := c.c.Call(ctx, "Echo", &args, &result)
	*kreq = kbench.BenchmarkMessage{}
	c.reqs.Put(kreq)
	if err != nil {
		return nil, err
	}
	// One allocation more than Kitex's own (Framework.AdapterAllocs).
	reply := new(benchpb.BenchmarkMessage)
	fromKitex(reply, result.GetSuccess())
	return reply, nil
}

func (c *kitexClient) Close() error {
	if cl, ok := c.c.(io.Closer); ok {
		return cl.Close()
	}
	return nil
}

func toKitex(dst *kbench.BenchmarkMessage, src *benchpb.BenchmarkMessage) {
	*dst = kbench.BenchmarkMessage{
		Field1: src.Field1, Field9: src.Field9, Field18: src.Field18, Field80: src.Field80, Field81: src.Field81,
		Field2: src.Field2, Field3: src.Field3, Field280: src.Field280, Field6: src.Field6, Field22: src.Field22,
		Field4: src.Field4, Field5: src.Field5, Field59: src.Field59, Field7: src.Field7, Field16: src.Field16,
		Field130: src.Field130, Field12: src.Field12, Field17: src.Field17, Field13: src.Field13, Field14: src.Field14,
		Field104: src.Field104, Field100: src.Field100, Field101: src.Field101, Field102: src.Field102, Field103: src.Field103,
		Field29: src.Field29, Field30: src.Field30, Field60: src.Field60, Field271: src.Field271, Field272: src.Field272,
		Field150: src.Field150, Field23: src.Field23, Field24: src.Field24, Field25: src.Field25, Field78: src.Field78,
		Field67: src.Field67, Field68: src.Field68, Field128: src.Field128, Field129: src.Field129, Field131: src.Field131,
		Padding: src.Padding,
	}
}

func fromKitex(dst *benchpb.BenchmarkMessage, src *kbench.BenchmarkMessage) {
	dst.Field1, dst.Field9, dst.Field18, dst.Field80, dst.Field81 = src.Field1, src.Field9, src.Field18, src.Field80, src.Field81
	dst.Field2, dst.Field3, dst.Field280, dst.Field6, dst.Field22 = src.Field2, src.Field3, src.Field280, src.Field6, src.Field22
	dst.Field4, dst.Field5, dst.Field59, dst.Field7, dst.Field16 = src.Field4, src.Field5, src.Field59, src.Field7, src.Field16
	dst.Field130, dst.Field12, dst.Field17, dst.Field13, dst.Field14 = src.Field130, src.Field12, src.Field17, src.Field13, src.Field14
	dst.Field104, dst.Field100, dst.Field101, dst.Field102, dst.Field103 = src.Field104, src.Field100, src.Field101, src.Field102, src.Field103
	dst.Field29, dst.Field30, dst.Field60, dst.Field271, dst.Field272 = src.Field29, src.Field30, src.Field60, src.Field271, src.Field272
	dst.Field150, dst.Field23, dst.Field24, dst.Field25, dst.Field78 = src.Field150, src.Field23, src.Field24, src.Field25, src.Field78
	dst.Field67, dst.Field68, dst.Field128, dst.Field129, dst.Field131 = src.Field67, src.Field68, src.Field128, src.Field129, src.Field131
	dst.Padding = src.Padding
}
