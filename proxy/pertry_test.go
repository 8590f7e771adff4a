package proxy_test

import (
	"context"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
	gproto "google.golang.org/protobuf/proto"
)

// freezable starts a server whose handler, once frozen, blocks until the
// test ends, as a SIGSTOPped process answers nothing. Its connections
// stay up.
func freezable(t *testing.T) (addr string, freeze func()) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr = l.Addr().String()
	var frozen atomic.Bool
	release := make(chan struct{})
	reply, _ := gproto.Marshal(&pb.StockReply{Sku: addr})
	srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		if frozen.Load() {
			<-release
		}
		resp.Payload = append(resp.Payload[:0], reply...)
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		close(release)
		srv.Close()
		<-done
	})
	return addr, func() { frozen.Store(true) }
}

// p99 returns the 99th percentile of d.
func p99(d []time.Duration) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	return d[len(d)*99/100]
}

// TestFrozenInstanceOnDefaults: one of three instances freezes under load
// from 64 callers of an idempotent method, with every option at its
// default. The adaptive per-try timeout cuts the attempts it holds, and
// they are retried elsewhere: no call fails, and from 2 s after the freeze
// p99 is back under twice what it was before.
func TestFrozenInstanceOnDefaults(t *testing.T) {
	var addrs []string
	var freeze func()
	for i := range 3 {
		a, f := freezable(t)
		addrs = append(addrs, a)
		if i == 0 {
			freeze = f
		}
	}
	c := client(t, addrs)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	type sample struct {
		start time.Time
		took  time.Duration
	}
	var mu sync.Mutex
	var samples []sample
	var failed []error
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				start := time.Now()
				_, err := invoke(ctx, c, proxy.Idempotent())
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					failed = append(failed, err)
				}
				samples = append(samples, sample{start, took})
				mu.Unlock()
			}
		})
	}
	// The load runs for fixed periods: nothing to await.
	time.Sleep(1500 * time.Millisecond)
	frozenAt := time.Now()
	freeze()
	time.Sleep(3 * time.Second)
	close(stop)
	wg.Wait()

	var before, after []time.Duration
	for _, s := range samples {
		switch {
		case s.start.After(frozenAt.Add(-time.Second)) && s.start.Before(frozenAt):
			before = append(before, s.took)
		case s.start.After(frozenAt.Add(2 * time.Second)):
			after = append(after, s.took)
		}
	}
	normal, late := p99(before), p99(after)
	t.Logf("%d calls; p99 %v before the freeze, %v from 2 s after it (%d calls)", len(samples), normal, late, len(after))
	if len(failed) > 0 {
		t.Fatalf("%d of %d idempotent calls failed with one instance frozen; first: %v", len(failed), len(samples), failed[0])
	}
	if len(before) < 100 || len(after) < 100 {
		t.Fatalf("too few calls to compare: %d before, %d after", len(before), len(after))
	}
	if late >= 2*normal {
		t.Fatalf("p99 %v from 2 s after the freeze, not under twice the %v before it", late, normal)
	}
}

// slowServer starts a server whose handler takes slow (or until the call
// is cancelled) for the requests isSlow picks, and answers the others at
// once. It returns its address and the count of the slow requests run.
func slowServer(t *testing.T, slow time.Duration, isSlow func(*protocol.Message) bool) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var n atomic.Int64
	srv := transport.NewServer(transport.HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if isSlow(req) {
			n.Add(1)
			select {
			case <-time.After(slow):
			case <-ctx.Done():
				return
			}
		}
		resp.Payload, _ = gproto.Marshal(&pb.StockReply{Sku: "ok"})
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() { srv.Close(); <-done })
	return l.Addr().String(), &n
}

// warmPeak makes 50 quick idempotent calls with c: the instance's latency
// peak learns them.
func warmPeak(ctx context.Context, t *testing.T, c *proxy.Client) {
	t.Helper()
	for range 50 {
		if _, err := invoke(ctx, c, proxy.Idempotent()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdaptivePerTrySparesLargeRequests: the adaptive per-try timeout,
// learned from small calls that answer at once, does not cut a large
// request (64 KiB or more) whose transfer and handling take longer than
// it: the large call succeeds on its first attempt, sent once.
func TestAdaptivePerTrySparesLargeRequests(t *testing.T) {
	const slow = 300 * time.Millisecond // over the adaptive floor, 100 ms
	addr, large := slowServer(t, slow, func(req *protocol.Message) bool { return len(req.Payload) >= 64<<10 })
	c := client(t, []string{addr, deadAddr(t)})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	warmPeak(ctx, t, c)
	req := &pb.StockRequest{Sku: string(make([]byte, 128<<10))}
	if err := c.Invoke(ctx, service, "M", req, new(pb.StockReply), proxy.Idempotent(), proxy.Timeout(5*time.Second)); err != nil {
		t.Fatalf("a large idempotent call that takes %v: %v", slow, err)
	}
	if n := large.Load(); n != 1 {
		t.Fatalf("the large request reached the server %d times, want once", n)
	}
}

// TestAdaptivePerTryNeedsAnotherInstance: with one instance listed, the
// adaptive per-try timeout does not cut an idempotent call that is slower
// than the instance's peak: a retry could only go to the same instance.
// The slow request reaches the server once, and the call succeeds.
func TestAdaptivePerTryNeedsAnotherInstance(t *testing.T) {
	const slow = 300 * time.Millisecond // over the adaptive floor, 100 ms
	addr, slowCalls := slowServer(t, slow, func(req *protocol.Message) bool {
		var in pb.StockRequest
		return gproto.Unmarshal(req.Payload, &in) == nil && in.Sku == "slow"
	})
	var attempts atomic.Int64
	count := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			call.OnAttempt = func(proxy.AttemptInfo) { attempts.Add(1) }
			return next(ctx, call)
		}
	}
	c := client(t, []string{addr}, proxy.WithMiddleware(count))
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	warmPeak(ctx, t, c)
	attempts.Store(0)
	err := c.Invoke(ctx, service, "M", &pb.StockRequest{Sku: "slow"}, new(pb.StockReply), proxy.Idempotent(),
		proxy.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("an idempotent call that takes %v on the only instance: %v", slow, err)
	}
	if n, a := slowCalls.Load(), attempts.Load(); n != 1 || a != 1 {
		t.Errorf("the slow request reached the server %d times in %d attempts, want once in one", n, a)
	}
}
