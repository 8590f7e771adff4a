package transport

import (
	"context"
	"net"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// BenchmarkRoundTrip measures one round trip over loopback, client and
// server together (both run in this process, so allocs/op counts both).
// Besides ns/op it reports writes/op, the write syscalls of both sides per
// round trip (2 when nothing coalesces), and cpu-ns/op, the process's CPU
// time per round trip, which a busy machine disturbs less than wall time.
func BenchmarkRoundTrip(b *testing.B) {
	handler := HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		resp.Payload = req.Payload
	})
	payload := make([]byte, 64)
	for _, bc := range []struct {
		name    string
		par     int // goroutines; 1 runs serially
		timeout bool
	}{
		{"p1", 1, false},
		{"p1-budget", 1, true},
		{"p64", 64, false},
		{"p64-budget", 64, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var writes atomic.Int64
			l := &countingListener{Listener: listen(b), writes: &writes}
			ts := startServerOn(b, l, handler, ServerConfig{})
			p := newPool(b, Config{Dial: func(ctx context.Context, addr string) (net.Conn, error) {
				var d net.Dialer
				c, err := d.DialContext(ctx, "tcp", addr)
				if err != nil {
					return nil, err
				}
				return &countingConn{Conn: c, writes: &writes}, nil
			}})
			ctx := context.Background()
			newReq := func() *protocol.Message {
				req := &protocol.Message{Service: "bench.Echo", Method: "Echo", Payload: payload}
				req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22))
				if bc.timeout {
					req.Timeout = defaultTestTimeout
				}
				return req
			}
			// Warm up both connections of the pool.
			for range 4 {
				warm, err := p.RoundTrip(ctx, ts.addr, newReq())
				if err != nil {
					b.Fatalf("warm-up: %v", err)
				}
				p.Release(warm)
			}
			b.ReportAllocs()
			writes.Store(0)
			cpu0 := cpuTime()
			b.ResetTimer()
			if bc.par == 1 {
				req := newReq()
				for b.Loop() {
					resp, err := p.RoundTrip(ctx, ts.addr, req)
					if err != nil {
						b.Fatal(err)
					}
					p.Release(resp)
				}
			} else {
				b.SetParallelism(max(1, bc.par/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					req := newReq()
					for pb.Next() {
						resp, err := p.RoundTrip(ctx, ts.addr, req)
						if err != nil {
							b.Error(err)
							return
						}
						p.Release(resp)
					}
				})
			}
			b.StopTimer()
			b.ReportMetric(float64(writes.Load())/float64(b.N), "writes/op")
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

type countingConn struct {
	net.Conn
	writes *atomic.Int64
}

func (c *countingConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

type countingListener struct {
	net.Listener
	writes *atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, writes: l.writes}, nil
}
