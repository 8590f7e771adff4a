package proxy_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

func TestHedgedCall(t *testing.T) {
	slow, fast := &seen{cancels: make(chan struct{}, 16)}, &seen{}
	slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for i := range 6 {
		start := time.Now()
		got, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(30*time.Millisecond), proxy.Timeout(2*time.Second))
		if err != nil {
			t.Fatalf("hedged call %d: %v", i, err)
		}
		if got != fastAddr {
			t.Fatalf("hedged call %d answered by %q", i, got)
		}
		if el := time.Since(start); el > time.Second {
			t.Fatalf("hedged call %d took %v", i, el)
		}
	}
	hit := slow.runs.Load()
	if hit == 0 {
		t.Fatal("no attempt went to the slow instance: the test proves nothing")
	}
	// The losing attempts were cancelled on the server (the cancel event).
	for range hit {
		select {
		case <-slow.cancels:
		case <-ctx.Done():
			t.Fatalf("%d of %d losing attempts were cancelled on the server", slow.cancelled.Load(), hit)
		}
	}
	// A method that is not idempotent is never hedged.
	before := slow.runs.Load() + fast.runs.Load()
	for range 4 {
		invoke(ctx, c, proxy.Hedge(10*time.Millisecond), proxy.Timeout(100*time.Millisecond))
	}
	if ran := slow.runs.Load() + fast.runs.Load() - before; ran != 4 {
		t.Fatalf("4 non-idempotent calls with Hedge ran %d attempts", ran)
	}
}

// TestHedgedCallTakesTheFirstAnswer: a hedged call ends with the first
// answer from a server, also when that answer is a failure no retry may
// change (70: the method ran and said no), cancelling the other attempt;
// it used to wait for the hanging attempt and time out with a 31. Round
// robin alternates the first pick, so one call starts on the hanging
// instance and hedges to the one that answers 70.
func TestHedgedCallTakesTheFirstAnswer(t *testing.T) {
	hang, fails := &seen{}, &seen{}
	hangAddr := serve(t, hang, waitCancel, transport.ServerConfig{})
	failAddr := serve(t, fails, protocol.StatusServiceError, transport.ServerConfig{})
	c := client(t, []string{hangAddr, failAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	const budget = 600 * time.Millisecond
	for i := range 2 {
		start := time.Now()
		_, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(20*time.Millisecond), proxy.Timeout(budget))
		el := time.Since(start)
		if got := protocol.StatusOf(err); got != protocol.StatusServiceError {
			t.Errorf("hedged call %d = %v after %v; want the remote 70 one attempt got", i, err, el.Round(time.Millisecond))
			continue
		}
		if el > budget/2 {
			t.Errorf("hedged call %d returned its 70 after %v, the budget being %v: it waited for the hanging attempt", i, el, budget)
		}
	}
	if hang.runs.Load() == 0 || fails.runs.Load() < 2 {
		t.Fatalf("the hanging instance ran %d attempts, the failing one %d: the test proves nothing", hang.runs.Load(), fails.runs.Load())
	}
}

// labelObserver sends the service and method of every attempt it is told
// of.
type labelObserver struct{ attempts chan string }

func (o *labelObserver) Attempted(svc, method, _ string, _ protocol.Status, _ time.Duration) {
	o.attempts <- svc + "." + method
}

func (o *labelObserver) Retried(string, string, protocol.Status) {}

func (o *labelObserver) BreakerChanged(string, string, string) {}

// TestHedgedLoserOutlivesCall: the losing attempt of a hedged call ends
// after Invoke has returned (and recycled its Call) and after the caller
// took its request back; it must still report the right method and never
// touch what the caller owns (the race detector watches the request).
func TestHedgedLoserOutlivesCall(t *testing.T) {
	slow, fast := &seen{}, &seen{}
	slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	obs := &labelObserver{attempts: make(chan string, 64)}
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"), proxy.WithObserver(obs),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	req := &pb.StockRequest{Sku: "x"}
	for i := range 6 {
		resp := new(pb.StockReply)
		if err := c.Invoke(ctx, service, "M", req, resp, proxy.Idempotent(), proxy.Hedge(20*time.Millisecond),
			proxy.Timeout(2*time.Second)); err != nil {
			t.Fatalf("hedged call %d: %v", i, err)
		}
		req.Sku = strings.Repeat("y", i+1) // the caller's again
		// Another call right away reuses the recycled Call.
		if _, err := invoke(ctx, c, proxy.FailFast(), proxy.Timeout(50*time.Millisecond)); err != nil &&
			!errors.Is(err, context.DeadlineExceeded) && protocol.StatusOf(err) != protocol.StatusServerTimeout {
			t.Fatalf("plain call after hedged call %d: %v", i, err)
		}
	}
	if slow.runs.Load() == 0 {
		t.Fatal("no attempt went to the slow instance: the test proves nothing")
	}
	// Every attempt is reported once it ends, the losers' last.
	for n := slow.runs.Load() + fast.runs.Load(); n > 0; n-- {
		select {
		case got := <-obs.attempts:
			if want := service + ".M"; got != want {
				t.Fatalf("an attempt was reported as %q, want %q", got, want)
			}
		case <-ctx.Done():
			t.Fatalf("%d attempts never reported their end", n)
		}
	}
}

// TestHedgeFollowsRetryPolicy: the backup attempt is a retry. MaxAttempts
// 1 or a spent retry budget stop it, and after an early failure it goes
// only when that failure may be retried, never with FailFast.
func TestHedgeFollowsRetryPolicy(t *testing.T) {
	t.Run("no backup after timeout", func(t *testing.T) {
		for _, p := range []proxy.RetryPolicy{{MaxAttempts: 1}, {BudgetRatio: 1e-9, BudgetFloor: -1}} {
			slow, fast := &seen{}, &seen{}
			slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
			fastAddr := serve(t, fast, 0, transport.ServerConfig{})
			c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"), proxy.WithRetry(p),
				proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			failed := 0
			for range 4 {
				if _, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(10*time.Millisecond), proxy.Timeout(100*time.Millisecond)); err != nil {
					failed++
				}
			}
			cancel()
			if slow.runs.Load() != 2 || fast.runs.Load() != 2 || failed != 2 {
				t.Errorf("policy %+v: slow ran %d, fast %d, %d of 4 failed; want 2, 2 (no backup) and 2",
					p, slow.runs.Load(), fast.runs.Load(), failed)
			}
		}
	})
	t.Run("no backup after a failure with FailFast", func(t *testing.T) {
		live := &seen{}
		var attempts atomic.Int64
		count := func(next proxy.Invoker) proxy.Invoker {
			return func(ctx context.Context, call *proxy.Call) error {
				call.OnAttempt = func(proxy.AttemptInfo) { attempts.Add(1) }
				return next(ctx, call)
			}
		}
		// Round robin starts on the dead instance. Its failed dial puts it
		// in backoff, which leaves it out of the next picks, until a slow
		// machine outlasts the backoff.
		c := client(t, []string{deadAddr(t), serve(t, live, 0, transport.ServerConfig{})}, proxy.WithBalancer("round_robin"),
			proxy.WithMiddleware(count))
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		failed := 0
		for range 4 {
			if _, err := invoke(ctx, c, proxy.Idempotent(), proxy.FailFast(), proxy.Hedge(time.Second)); err != nil {
				failed++
			}
		}
		if failed == 0 || attempts.Load() != 4 || live.runs.Load() != int64(4-failed) {
			t.Errorf("4 FailFast calls, the first starting on a dead instance: %d failed, %d attempts, the live one ran %d; want at least 1, 4 (no backup) and %d",
				failed, attempts.Load(), live.runs.Load(), 4-failed)
		}
	})
}

// TestHedgeLeavesNothingInFlight: a backup that is not sent (the budget
// is spent by the time the first attempt failed) must not stay counted
// in flight by the balancer, or least_active shuns that instance for good.
func TestHedgeLeavesNothingInFlight(t *testing.T) {
	slow, fast := &seen{}, &seen{}
	slowAddr := serve(t, slow, waitCancel, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("least_active"),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Calls whose first attempt lands on the slow instance time out
	// before the hedge delay, with no budget left for a backup.
	for slow.runs.Load() < 3 {
		if ctx.Err() != nil {
			t.Fatal("no call reached the slow instance")
		}
		invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(time.Second), proxy.Timeout(30*time.Millisecond))
	}
	before := fast.runs.Load()
	for range 20 {
		invoke(ctx, c, proxy.FailFast(), proxy.Timeout(20*time.Millisecond))
	}
	if got := fast.runs.Load() - before; got == 0 {
		t.Fatal("the fast instance got none of 20 calls with nothing in flight: an unsent backup stayed counted in flight")
	}
}

// breakingServer accepts connections, reads whatever the client sends
// (the request reached it) and closes the connection: the attempt fails
// after sending, and the server may have acted on it.
func breakingServer(t *testing.T) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var got atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				buf := make([]byte, 4096)
				if n, _ := c.Read(buf); n > 0 {
					got.Add(1)
				}
			}()
		}
	}()
	t.Cleanup(func() { l.Close(); wg.Wait() })
	return l.Addr().String(), &got
}

// TestHedgedCallNotSentOnlyWhenNoAttemptWasSent: a hedged call whose first
// attempt was sent (the connection broke after the server read it) and
// whose backup failed unsent (a dead instance) returns the first attempt's
// error, not ErrNotSent.
func TestHedgedCallNotSentOnlyWhenNoAttemptWasSent(t *testing.T) {
	breaking, reached := breakingServer(t)
	dead := deadAddr(t)
	c := client(t, []string{breaking, dead}, proxy.WithBalancer("round_robin"),
		proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 2}),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	checked := 0
	for i := range 20 {
		before := reached.Load()
		_, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(time.Second), proxy.Timeout(2*time.Second))
		if err == nil {
			t.Fatalf("call %d succeeded against a breaking and a dead instance", i)
		}
		if reached.Load() == before {
			continue // the breaking instance never got this call's request
		}
		checked++
		if errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("hedged call %d reached %s (its request was read there before the connection broke), yet its error says ErrNotSent: %v",
				i, breaking, err)
		}
	}
	if checked == 0 {
		t.Fatal("no call reached the breaking instance: the test proves nothing")
	}
}
