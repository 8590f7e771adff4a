package proxy_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

// relay forwards TCP connections to target. While paused it neither reads
// nor writes, as a process stopped with SIGSTOP: the kernel accepts and
// buffers for it, and nothing comes back, not even heartbeats.
type relay struct {
	addr string
	mu   sync.Mutex
	gate chan struct{} // closed while the relay runs
	l    net.Listener
	wg   sync.WaitGroup
	cs   []net.Conn
}

func startRelay(t *testing.T, target string) *relay {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &relay{addr: l.Addr().String(), l: l, gate: make(chan struct{})}
	close(r.gate)
	r.wg.Go(func() {
		for {
			in, err := l.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", target)
			if err != nil {
				in.Close()
				continue
			}
			r.mu.Lock()
			r.cs = append(r.cs, in, out)
			r.mu.Unlock()
			r.wg.Go(func() { r.pipe(out, in) })
			r.wg.Go(func() { r.pipe(in, out) })
		}
	})
	t.Cleanup(func() {
		r.resume()
		l.Close()
		r.mu.Lock()
		for _, c := range r.cs {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// pipe copies src to dst, waiting at the gate before each read and write.
func (r *relay) pipe(dst, src net.Conn) {
	defer dst.Close()
	buf := make([]byte, 32<<10)
	for {
		r.wait()
		n, err := src.Read(buf)
		if n > 0 {
			r.wait()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (r *relay) wait() {
	r.mu.Lock()
	g := r.gate
	r.mu.Unlock()
	<-g
}

func (r *relay) pause() {
	r.mu.Lock()
	r.gate = make(chan struct{})
	r.mu.Unlock()
}

func (r *relay) resume() {
	r.mu.Lock()
	select {
	case <-r.gate:
	default:
		close(r.gate)
	}
	r.mu.Unlock()
}

// lineCounter counts the log records whose message holds a string.
type lineCounter struct {
	sub string
	n   *atomic.Int64
}

func (h lineCounter) Enabled(context.Context, slog.Level) bool { return true }
func (h lineCounter) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.sub) {
		h.n.Add(1)
	}
	return nil
}
func (h lineCounter) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h lineCounter) WithGroup(string) slog.Handler      { return h }

// TestNoCallWaitsOnFrozenInstance: an instance frozen as by SIGSTOP (it
// reads nothing and answers nothing) has its breaker opened by the calls
// it held. From then on no call is sent to it, through several open
// periods: each ends with a heartbeat, which goes unanswered, and the
// breaker stays open. Once the instance reads again, it answers the
// heartbeat, a call probes it, and its breaker closes.
func TestNoCallWaitsOnFrozenInstance(t *testing.T) {
	good := serve(t, &seen{}, 0, transport.ServerConfig{})
	r := startRelay(t, serve(t, &seen{}, 0, transport.ServerConfig{}))
	var unanswered atomic.Int64
	var toFrozen atomic.Int64
	var counting atomic.Bool
	watch := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			call.OnAttempt = func(a proxy.AttemptInfo) {
				if a.Addr == r.addr && counting.Load() {
					toFrozen.Add(1)
				}
			}
			return next(ctx, call)
		}
	}
	c := client(t, []string{good, r.addr}, proxy.WithBalancer("round_robin"), proxy.WithMiddleware(watch),
		proxy.WithLogger(slog.New(lineCounter{"no answer to a heartbeat", &unanswered})),
		proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 2, OpenTimeout: 20 * time.Millisecond,
			MaxOpenTimeout: 80 * time.Millisecond, ProbeTimeout: 20 * time.Millisecond}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	call := func() {
		t.Helper()
		if _, err := invoke(ctx, c, proxy.Idempotent(), proxy.Timeout(2*time.Second)); err != nil {
			t.Fatalf("an idempotent call failed with one of two instances frozen: %v", err)
		}
	}
	for range 20 {
		call()
	}

	r.pause()
	for c.BreakerState(r.addr) != "open" {
		if ctx.Err() != nil {
			t.Fatal("the frozen instance's breaker never opened")
		}
		call()
	}
	// Every call so far has returned: those from now on were all picked
	// after the breaker opened.
	counting.Store(true)
	for unanswered.Load() < 3 {
		if ctx.Err() != nil {
			t.Fatalf("%d heartbeats went unanswered before the test's deadline, want 3", unanswered.Load())
		}
		call()
	}
	counting.Store(false)
	if n := toFrozen.Load(); n > 0 {
		t.Fatalf("%d calls were sent to the frozen instance while its breaker was open or half-open", n)
	}

	r.resume()
	wait.Until(t, testTimeout, time.Millisecond, "the breaker to close once the instance answers", func() bool {
		call()
		return c.BreakerState(r.addr) == "closed"
	})
	toFrozen.Store(0)
	counting.Store(true)
	for range 4 { // round robin
		call()
	}
	if toFrozen.Load() == 0 {
		t.Fatal("no call reached the instance after its breaker closed")
	}
}
