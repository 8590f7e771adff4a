package bench_test

import (
	"context"
	"net"
	"sync/atomic"
	"testing"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/bench/internal/leaktest"
	"google.golang.org/protobuf/proto"

	"github.com/dabbrpc/dabb/bench/echo"
	"github.com/dabbrpc/dabb/bench/frameworks"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, leaktest.Ignore()...)
}

// start serves f on a loopback port of this process and returns a client.
func start(tb testing.TB, f frameworks.Framework) frameworks.Client {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv, err := f.Serve(l)
	if err != nil {
		tb.Fatal(err)
	}
	c, err := f.Dial(l.Addr().String())
	if err != nil {
		srv.Close()
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		c.Close()
		srv.Close()
	})
	return c
}

// inProcess returns every framework whose server and client run in this
// process: all but those with a program of their own.
func inProcess() []frameworks.Framework {
	var fs []frameworks.Framework
	for _, f := range append(append(frameworks.All(), frameworks.Extra()...), frameworks.Dubbo()...) {
		if f.Program == "" {
			fs = append(fs, f)
		}
	}
	return fs
}

// BenchmarkEcho is one call of the workload, client and server in this
// process: allocs/op and B/op count both sides. Compare with
// BenchmarkCodecFloor. The TLS frameworks and dabb-hessian2 run too, so
// that dabbbench finds their counts when -frameworks names them.
func BenchmarkEcho(b *testing.B) {
	for _, f := range inProcess() {
		b.Run(f.Name, func(b *testing.B) {
			c := start(b, f)
			ctx := context.Background()
			req := benchpb.NewMessage(0)
			if reply, err := c.Echo(ctx, req); err != nil || benchpb.Check(req, reply) != nil {
				b.Fatalf("first call: %v %v", err, benchpb.Check(req, reply))
			}
			b.ReportAllocs()
			for b.Loop() {
				reply, err := c.Echo(ctx, req)
				if err != nil {
					b.Fatal(err)
				}
				if reply.Field1 != "OK" {
					b.Fatalf("reply field1 %q", reply.Field1)
				}
			}
		})
	}
}

// BenchmarkEchoParallel is BenchmarkEcho from 32 × GOMAXPROCS goroutines
// (64 on 2 CPUs) sharing the client, where batching writers have something
// to batch. It reports how many goroutines called as its "goroutines"
// metric, which dabbbench's allocations table names.
func BenchmarkEchoParallel(b *testing.B) {
	for _, f := range inProcess() {
		b.Run(f.Name, func(b *testing.B) {
			c := start(b, f)
			ctx := context.Background()
			// The server's start, the dial and the first call (which may
			// open the connection) are not timed or counted.
			req := benchpb.NewMessage(0)
			if reply, err := c.Echo(ctx, req); err != nil || benchpb.Check(req, reply) != nil {
				b.Fatalf("first call: %v %v", err, benchpb.Check(req, reply))
			}
			b.ReportAllocs()
			b.SetParallelism(32)
			b.ResetTimer()
			var goroutines atomic.Int64
			b.RunParallel(func(pb *testing.PB) {
				goroutines.Add(1)
				req := benchpb.NewMessage(0)
				for pb.Next() {
					if _, err := c.Echo(ctx, req); err != nil {
						b.Error(err)
						return
					}
				}
			})
			b.ReportMetric(float64(goroutines.Load()), "goroutines")
		})
	}
}

// BenchmarkDabbKeyed is BenchmarkEcho/dabb through Deliver, the same method
// not declared idempotent: each call carries an idempotency key.
func BenchmarkDabbKeyed(b *testing.B) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	srv, err := frameworks.Dabb().Serve(l)
	if err != nil {
		b.Fatal(err)
	}
	defer srv.Close()
	c, err := proxy.NewClient(static.New(registry.Instance{Addr: l.Addr().String()}))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	stub := echo.NewEchoClient(c)
	ctx := context.Background()
	req := benchpb.NewMessage(0)
	if reply, err := stub.Deliver(ctx, req); err != nil || benchpb.Check(req, reply) != nil {
		b.Fatalf("first call: %v %v", err, benchpb.Check(req, reply))
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := stub.Deliver(ctx, req); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCodecFloor is the protobuf work of one call and nothing else:
// the request marshaled into a reused buffer and unmarshaled into a new
// message, the reply the same. No framework can allocate less per call
// with this codec.
func BenchmarkCodecFloor(b *testing.B) {
	req := benchpb.NewMessage(0)
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		var err error
		buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], req)
		if err != nil {
			b.Fatal(err)
		}
		in := new(benchpb.BenchmarkMessage)
		if err := proto.Unmarshal(buf, in); err != nil {
			b.Fatal(err)
		}
		benchpb.Answer(in)
		buf, err = proto.MarshalOptions{}.MarshalAppend(buf[:0], in)
		if err != nil {
			b.Fatal(err)
		}
		out := new(benchpb.BenchmarkMessage)
		if err := proto.Unmarshal(buf, out); err != nil {
			b.Fatal(err)
		}
	}
}
