package dabb_test

import (
	"context"
	"testing"
	"time"

	gproto "google.golang.org/protobuf/proto"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

// BenchmarkCall is one small call of an idempotent method through
// proxy.Client, over loopback, to a dabb.Server in the same process: its
// allocs/op count the client and the server together. Compare with
// BenchmarkCodecFloor, what the protobuf codec alone allocates for the
// same two messages. BenchmarkCallWithKey is the same call for a method
// that is not idempotent, which carries an idempotency key.
func BenchmarkCall(b *testing.B) { benchmarkCall(b, proxy.Idempotent()) }

// BenchmarkCallWithKey: see BenchmarkCall.
func BenchmarkCallWithKey(b *testing.B) { benchmarkCall(b) }

func benchmarkCall(b *testing.B, opts ...proxy.CallOption) {
	for _, par := range []struct {
		name string
		n    int
	}{{"p1", 0}, {"p64", 64}} {
		b.Run(par.name, func(b *testing.B) {
			_, addr := startServer(b, newProbe())
			c := newClient(b, addr)
			ctx := context.Background()
			if _, err := call(ctx, c, "echo", opts...); err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			if par.n == 0 {
				for b.Loop() {
					if _, err := call(ctx, c, "echo", opts...); err != nil {
						b.Fatal(err)
					}
				}
				return
			}
			b.SetParallelism(par.n)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := call(ctx, c, "echo", opts...); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}

// BenchmarkCodecFloor is what one call of BenchmarkCall costs in the
// protobuf codec alone: the request built, marshalled and unmarshalled, the
// reply the same.
func BenchmarkCodecFloor(b *testing.B) {
	var buf []byte
	b.ReportAllocs()
	for b.Loop() {
		req := &pb.StockRequest{Sku: "echo"}
		var err error
		buf, err = gproto.MarshalOptions{}.MarshalAppend(buf[:0], req)
		if err != nil {
			b.Fatal(err)
		}
		in := new(pb.StockRequest)
		if err := gproto.Unmarshal(buf, in); err != nil {
			b.Fatal(err)
		}
		reply := &pb.StockReply{Sku: in.GetSku(), Count: 1}
		buf, err = gproto.MarshalOptions{}.MarshalAppend(buf[:0], reply)
		if err != nil {
			b.Fatal(err)
		}
		out := new(pb.StockReply)
		if err := gproto.Unmarshal(buf, out); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBareTransport is the same small call as BenchmarkCall made
// straight through a transport.Pool, with the request encoded once and the
// reply not decoded: what BenchmarkCall adds on top of it is the client
// chain (options, balancing, breaker, retry bookkeeping) and the codec.
func BenchmarkBareTransport(b *testing.B) {
	_, addr := startServer(b, newProbe())
	pool := transport.NewPool(transport.Config{})
	defer pool.Close()
	payload, err := gproto.Marshal(&pb.StockRequest{Sku: "echo"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	m := &protocol.Message{Service: probeDesc.Name, Method: "Do", Payload: payload}
	b.ReportAllocs()
	for b.Loop() {
		m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 0)
		m.Timeout = time.Second
		resp, err := pool.RoundTrip(ctx, addr, m)
		if err != nil {
			b.Fatal(err)
		}
		pool.Release(resp)
	}
}
