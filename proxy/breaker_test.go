package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

func TestBreakerOpensAndRecovers(t *testing.T) {
	bad, good := &seen{}, &seen{}
	badAddr := serve(t, bad, protocol.StatusServerError, transport.ServerConfig{})
	goodAddr := serve(t, good, 0, transport.ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	c := client(t, []string{badAddr, goodAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 3, OpenTimeout: 300 * time.Millisecond}))
	for c.BreakerState(badAddr) != "open" {
		if ctx.Err() != nil {
			t.Fatal("the breaker of the failing instance never opened")
		}
		invoke(ctx, c, proxy.FailFast())
	}
	if n := bad.runs.Load(); n != 3 {
		t.Fatalf("the breaker opened after %d calls, want 3", n)
	}
	opened := time.Now()
	// While open, calls go to the good instance only.
	for i := range 20 {
		got, err := invoke(ctx, c)
		if err != nil || got != goodAddr {
			t.Fatalf("call %d while open: %q, %v", i, got, err)
		}
	}
	if n := bad.runs.Load(); n != 3 && time.Since(opened) < 300*time.Millisecond {
		t.Fatalf("the open breaker let %d more calls through", n-3)
	}
	if c.BreakerState(goodAddr) != "closed" {
		t.Fatalf("good instance's breaker is %s", c.BreakerState(goodAddr))
	}
	// The instance recovers: after the open timeout a probe goes through
	// and the breaker closes.
	bad.healed.Store(true)
	for c.BreakerState(badAddr) != "closed" {
		if ctx.Err() != nil {
			t.Fatalf("the breaker did not close after recovery (state %s)", c.BreakerState(badAddr))
		}
		if _, err := invoke(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCancelledCallKeepsHalfOpenBreakerUsable: a call whose caller has
// already given up, made while a breaker is half-open, neither takes the
// probe nor leaves the instance out: the next call goes through, succeeds
// and closes the breaker. (A probe whose outcome the breaker excluded once
// counted as taken for good, and a healthy instance was lost until the
// process restarted; TestHalfOpenWithProbeInFlightIsUnavailable covers
// the excluded probe itself.)
func TestCancelledCallKeepsHalfOpenBreakerUsable(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, protocol.StatusServerError, transport.ServerConfig{})
	const openFor = 50 * time.Millisecond
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: openFor}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	// One 80 opens the breaker; then the instance recovers.
	if _, err := invoke(ctx, c, proxy.FailFast()); protocol.StatusOf(err) != protocol.StatusServerError {
		t.Fatalf("first call = %v, want a remote 80", err)
	}
	if st := c.BreakerState(addr); st != "open" {
		t.Fatalf("breaker %s after an 80 with ConsecutiveFailures 1, want open", st)
	}
	s.healed.Store(true)
	// Wait out the open timeout: BreakerState turns the breaker half-open.
	for c.BreakerState(addr) != "half-open" {
		if ctx.Err() != nil {
			t.Fatal("the breaker never turned half-open")
		}
		time.Sleep(5 * time.Millisecond) // a timer inside gobreaker; nothing to await
	}

	// The probe: a caller that has already given up. The call is picked,
	// goes through the breaker and fails as cancelled (excluded).
	gone, stop := context.WithCancel(ctx)
	stop()
	if _, err := invoke(gone, c); !errors.Is(err, proxy.ErrCanceled) {
		t.Fatalf("call with a cancelled context = %v, want ErrCanceled", err)
	}

	if _, err := invoke(ctx, c); err != nil {
		t.Fatalf("a healthy instance is left out after a cancelled call in half-open (breaker %s): %v",
			c.BreakerState(addr), err)
	}
	if st := c.BreakerState(addr); st != "closed" {
		t.Errorf("breaker %s after a successful call, want closed", st)
	}
}

// TestOversizedRequestKeepsBreakersClosed: a request over the server's
// MaxBody is the caller's fault. It fails with status 40 and is not
// retried, and it counts against no instance: other callers keep calling.
func TestOversizedRequestKeepsBreakersClosed(t *testing.T) {
	s1, s2 := &seen{}, &seen{}
	a1 := serve(t, s1, 0, transport.ServerConfig{MaxBody: 1024})
	a2 := serve(t, s2, 0, transport.ServerConfig{MaxBody: 1024})
	c := client(t, []string{a1, a2}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 3}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	big := &pb.StockRequest{Sku: strings.Repeat("x", 4096)}
	for i := range 4 {
		err := c.Invoke(ctx, service, "M", big, new(pb.StockReply), proxy.Idempotent())
		if got := protocol.StatusOf(err); got != protocol.StatusBadRequest {
			t.Fatalf("oversized call %d: status %d (%v), want 40", i, got, err)
		}
	}
	for _, a := range []string{a1, a2} {
		if st := c.BreakerState(a); st != "closed" {
			t.Errorf("breaker of %s is %s after oversized requests, want closed", a, st)
		}
	}
	if _, err := invoke(ctx, c); err != nil {
		t.Fatalf("a well-formed call after the oversized ones: %v", err)
	}
}

// TestRatioBreakerOpensForDeadInstance: with a ratio-based breaker
// (FailureRatio, MinRequests), calls counted neither way (dial-backoff
// refusals, shed 100s, callers that gave up) do not dilute the ratio:
// gobreaker counts them in Requests, so an address whose every dial fails,
// each failed dial followed by dozens of refusals, never reached the ratio.
func TestRatioBreakerOpensForDeadInstance(t *testing.T) {
	dead := deadAddr(t)
	c := client(t, []string{dead}, proxy.WithBreaker(proxy.BreakerConfig{
		ConsecutiveFailures: 1 << 30, // ratio only
		FailureRatio:        0.5,
		MinRequests:         4,
	}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond) // pacing only
	defer tick.Stop()
	dials, backedOff := 0, 0
	for dials < 5 {
		if ctx.Err() != nil {
			t.Fatalf("only %d failed dials in %v", dials, testTimeout)
		}
		if callDead(ctx, t, c) {
			backedOff++
		} else {
			dials++
		}
		if c.BreakerState(dead) != "closed" {
			return
		}
		<-tick.C
	}
	t.Errorf("breaker of an address whose %d dials all failed is still closed (%d calls refused by the dial backoff dilute the ratio); want open: every call it counted failed, FailureRatio 0.5, MinRequests 4",
		dials, backedOff)
}

// TestShedCallsDoNotOpenTheBreaker: an instance that sheds calls (100,
// all its MaxConcurrent slots busy) is overloaded, not failing: its
// breaker stays closed, so a load spike does not take the instance (the
// only one here) out for OpenTimeout.
func TestShedCallsDoNotOpenTheBreaker(t *testing.T) {
	busy := &seen{}
	addr := serve(t, busy, protocol.StatusServerThreadpoolExhausted, transport.ServerConfig{MaxConcurrent: 1})
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 3}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Occupy the only slot: the handler holds it until cleanup (the
	// caller itself gives up after 100ms).
	for busy.runs.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("no call reached the server")
		}
		invoke(ctx, c, proxy.Timeout(100*time.Millisecond), proxy.FailFast())
	}
	for i := range 10 {
		_, err := invoke(ctx, c, proxy.FailFast())
		var pe *protocol.Error
		if !errors.As(err, &pe) || !pe.Remote || pe.Status != protocol.StatusServerThreadpoolExhausted {
			t.Fatalf("call %d to a server with its only slot taken = %v; want a remote 100", i, err)
		}
	}
	if got := c.BreakerState(addr); got != "closed" {
		t.Errorf("breaker of an instance that shed 10 calls is %s; want closed", got)
	}
}

// TestDialBackoffIsNotCountedAgain: calls refused by the dial backoff
// (the address's last dial failed moments ago) touch no network and
// repeat that dial's failure, which the breaker counted once already.
func TestDialBackoffIsNotCountedAgain(t *testing.T) {
	dead := deadAddr(t)
	const trip = 3
	c := client(t, []string{dead}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: trip}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dials, backedOff := 0, 0
	for backedOff < 2*trip {
		if callDead(ctx, t, c) {
			backedOff++
		} else {
			dials++
		}
		if got := c.BreakerState(dead); got != "closed" {
			if dials >= trip {
				t.Skipf("%d real dials happened among the calls (a slow machine outlasted the backoff); inconclusive", dials)
			}
			t.Fatalf("breaker after %d failed dial(s) and %d calls refused by the dial backoff is %s; want closed (%d failures open it)",
				dials, backedOff, got, trip)
		}
	}
}

// callDead makes one call, with no retry, through c to an address nothing
// listens on, and reports whether the dial backoff refused it; false means
// a dial was made and failed.
func callDead(ctx context.Context, t *testing.T, c *proxy.Client) (backedOff bool) {
	t.Helper()
	_, err := invoke(ctx, c, proxy.FailFast())
	switch {
	case err == nil:
		t.Fatal("a call to an address nothing listens on succeeded")
	case errors.Is(err, transport.ErrDialBackoff):
		return true
	case !errors.Is(err, proxy.ErrNotSent) || ctx.Err() != nil:
		t.Fatalf("call to a dead address = %v", err)
	}
	return false
}

// TestDrainingAddressKeepsItsBreaker: the answers of an address that
// announced its shutdown do not count against its breaker (the next
// process there, a restart on the same port, would inherit it).
func TestDrainingAddressKeepsItsBreaker(t *testing.T) {
	addr := drainingServer(t)
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); !errors.Is(err, proxy.ErrNotSent) && !errors.Is(err, proxy.ErrOverloaded) {
		t.Fatalf("call to a draining address = %v; want it refused", err)
	}
	if got := c.BreakerState(addr); got != "closed" {
		t.Errorf("the draining address's breaker is %s after its shutting-down answers; want closed", got)
	}
}

// TestRestartResetsTheBreaker: a server restarted at an address whose
// breaker is open gets calls as soon as it answers, not after the old
// process's open timeout.
func TestRestartResetsTheBreaker(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	failing := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		resp.Header.SetStatus(protocol.StatusServerError) // 80: counts against the breaker
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- failing.Serve(l) }()
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Hour}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, _ = invoke(ctx, c)
	if got := c.BreakerState(addr); got != "open" {
		t.Fatalf("breaker %s after a failure with ConsecutiveFailures 1; want open", got)
	}
	if err := failing.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-done
	restartAndCall(t, c, addr)
}

// refusingServer starts a transport server that answers every request
// with status and code, as a server's auth interceptor rejects a call. It
// counts the requests it answers.
func refusingServer(t *testing.T, status protocol.Status, code string) (string, *atomic.Int64) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	runs := new(atomic.Int64)
	srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		runs.Add(1)
		resp.SetError(&protocol.Error{Status: status, Code: code, Msg: "refused"})
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return l.Addr().String(), runs
}

// TestRefusedCallsKeepTheBreakerClosed: 100 rejections of the caller's
// credentials leave the instance's breaker closed. They come as the
// interceptors send them (40) and as a peer might (80, which otherwise
// counts against the instance).
func TestRefusedCallsKeepTheBreakerClosed(t *testing.T) {
	for _, tc := range []struct {
		status protocol.Status
		code   string
		want   error
	}{
		{protocol.StatusBadRequest, protocol.CodeUnauthenticated, proxy.ErrUnauthenticated},
		{protocol.StatusBadRequest, protocol.CodePermissionDenied, proxy.ErrPermissionDenied},
		{protocol.StatusServerError, protocol.CodeUnauthenticated, proxy.ErrUnauthenticated},
	} {
		t.Run(fmt.Sprintf("%d %s", tc.status, tc.code), func(t *testing.T) {
			addr, runs := refusingServer(t, tc.status, tc.code)
			c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 3}))
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			for i := range 100 {
				if _, err := invoke(ctx, c, proxy.Idempotent()); !errors.Is(err, tc.want) {
					t.Fatalf("call %d = %v; want %v", i, err, tc.want)
				}
			}
			if got := c.BreakerState(addr); got != "closed" {
				t.Errorf("breaker after 100 rejections is %s; want closed", got)
			}
			if n := runs.Load(); n != 100 {
				t.Errorf("the server answered %d requests for 100 calls; want 100", n)
			}
		})
	}
}

// TestEveryInstanceBackWithinASecond: when every breaker of a service is
// open, calls go to its instances anyway (the panic threshold). So a
// service whose instances all died and came back is called again within a
// second of their return, not after OpenTimeout.
func TestEveryInstanceBackWithinASecond(t *testing.T) {
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) {
			var addrs []string
			var servers []*transport.Server
			var dones []<-chan error
			for range n {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				srv, done := serveOK(l)
				addrs = append(addrs, l.Addr().String())
				servers, dones = append(servers, srv), append(dones, done)
			}
			// The default breakers: five failures open one for 5 s.
			c := client(t, addrs)
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			for i := range 10 {
				if _, err := invoke(ctx, c); err != nil {
					t.Fatalf("call %d before the outage: %v", i, err)
				}
			}
			// Every instance dies without a goodbye, as under kill -9.
			for i, srv := range servers {
				srv.Close()
				<-dones[i]
			}
			allOpen := func() bool {
				for _, a := range addrs {
					if c.BreakerState(a) == "closed" {
						return false
					}
				}
				return true
			}
			for !allOpen() {
				if ctx.Err() != nil {
					t.Fatal("the breakers never opened while every instance was down")
				}
				if _, err := invoke(ctx, c, proxy.Idempotent()); err == nil {
					t.Fatal("a call succeeded with every instance down")
				}
			}
			back := time.Now()
			for _, a := range addrs {
				l, err := net.Listen("tcp", a)
				if err != nil {
					t.Skipf("cannot listen again on %s: %v", a, err)
				}
				srv, done := serveOK(l)
				t.Cleanup(func() { srv.Close(); <-done })
			}
			for {
				_, err := invoke(ctx, c)
				if err == nil {
					break
				}
				if time.Since(back) > time.Second {
					t.Fatalf("no call succeeded within 1 s of every instance's return (breaker %s): %v",
						c.BreakerState(addrs[0]), err)
				}
				time.Sleep(10 * time.Millisecond) // no event says the instances are back: poll the calls
			}
			t.Logf("called again %v after the return", time.Since(back).Round(time.Millisecond))
		})
	}
}

// TestBreakerCountsRunsOnly: a closed breaker lets successes bypass it (no
// lock, no clock), yet a success between failures still ends their run, and
// a run of ConsecutiveFailures opens it, whichever way its attempts went.
func TestBreakerCountsRunsOnly(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, protocol.StatusServerError, transport.ServerConfig{})
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 3, OpenTimeout: time.Hour, PanicThreshold: -1}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	call := func(ok bool) {
		t.Helper()
		s.healed.Store(ok)
		_, err := invoke(ctx, c, proxy.FailFast())
		if ok != (err == nil) {
			t.Fatalf("call (server healthy: %v) = %v", ok, err)
		}
	}
	for round := range 5 {
		call(false)
		call(false)
		call(true)
		call(true) // the first success went through the breaker; this one bypasses it
		if st := c.BreakerState(addr); st != "closed" {
			t.Fatalf("round %d: two failures between successes left the breaker %s", round, st)
		}
	}
	call(false)
	call(false)
	s.healed.Store(false)
	if _, err := invoke(ctx, c, proxy.FailFast()); protocol.StatusOf(err) != protocol.StatusServerError {
		t.Fatalf("third failure = %v, want a remote 80", err)
	}
	if st := c.BreakerState(addr); st != "open" {
		t.Fatalf("after three failures in a row the breaker is %s, want open", st)
	}
	if _, err := invoke(ctx, c); !errors.Is(err, proxy.ErrNotSent) {
		t.Fatalf("call on an open breaker = %v, want not sent", err)
	}
}
