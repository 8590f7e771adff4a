package transport

import (
	"context"
	"runtime"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// BenchmarkRoundTrip measures one round trip over loopback, client and
// server together (both run in this process, so allocs/op counts both).
// Besides ns/op it reports writes/op, the write system calls of both sides
// per round trip (2 when nothing coalesces; Linux only, from /proc/self/io,
// so the runtime's own wake-up writes count too), and cpu-ns/op, the
// process's CPU time per round trip, which a busy machine disturbs less than
// wall time. The connections are plain TCP ones, so the writer takes the
// path it takes in production (see rawWriter.init).
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
			ts := startServerOn(b, listen(b), handler, ServerConfig{})
			p := newPool(b, Config{})
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
			writes0, counted := writeSyscalls()
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
			if writes, ok := writeSyscalls(); ok && counted {
				b.ReportMetric(float64(writes-writes0)/float64(b.N), "writes/op")
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}
