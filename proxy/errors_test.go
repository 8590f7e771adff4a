package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

func TestUnavailable(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	t.Run("no instance", func(t *testing.T) {
		c := client(t, nil)
		_, err := invoke(ctx, c)
		if !errors.Is(err, proxy.ErrUnavailable) || !errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("got %v, want unavailable and not sent", err)
		}
		if !strings.Contains(err.Error(), "no instance of test.Svc") {
			t.Fatalf("message %q does not name the service", err)
		}
	})
	t.Run("all dead", func(t *testing.T) {
		c := client(t, []string{deadAddr(t), deadAddr(t)})
		_, err := invoke(ctx, c)
		if !errors.Is(err, proxy.ErrUnavailable) || !errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("got %v, want unavailable and not sent", err)
		}
	})
	t.Run("closed client", func(t *testing.T) {
		c := client(t, []string{deadAddr(t)})
		c.Close()
		_, err := invoke(ctx, c)
		if !errors.Is(err, proxy.ErrNotSent) || !strings.Contains(err.Error(), "client closed") {
			t.Fatalf("got %v, want client closed", err)
		}
	})
}

// wantNoInstance fails unless err is the error of a call that found no
// instance: it matches ErrUnavailable (and, when first is set, for a call
// that made no attempt, ErrNotSent and balancer.ErrNoInstance too), and
// its text says each thing once, with none of the balancer's or the
// transport's words for "no instance".
func wantNoInstance(t *testing.T, what string, err error, first bool) {
	t.Helper()
	t.Logf("%s: %v", what, err)
	if !errors.Is(err, proxy.ErrUnavailable) {
		t.Errorf("%s = %v; want ErrUnavailable", what, err)
	}
	if first && (!errors.Is(err, proxy.ErrNotSent) || !errors.Is(err, balancer.ErrNoInstance)) {
		t.Errorf("%s = %v; want ErrNotSent and balancer.ErrNoInstance", what, err)
	}
	if err == nil {
		return
	}
	msg := err.Error()
	for _, p := range []string{"no instance", service, "known instance", "circuit breaker", "shutting down"} {
		if n := strings.Count(msg, p); n > 1 {
			t.Errorf("%s says %q %d times: %q", what, p, n, msg)
		}
	}
	if first {
		for _, p := range []string{"balancer", "unavailable", "transport"} {
			if strings.Contains(msg, p) {
				t.Errorf("%s says %q: %q", what, p, msg)
			}
		}
	}
}

// TestNoInstanceErrors: the error of a call that finds no instance is one
// sentence that names the service, says how many instances are known and
// why none could take the call. It said it three times: the client's "no
// instance of", the balancer's "no instance available: ... unavailable"
// and the transport's "request not sent".
func TestNoInstanceErrors(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	const lead = "status 35 (channel inactive): no instance of " + service + " can take the call: "

	t.Run("none listed", func(t *testing.T) {
		rec := &callRecorder{}
		c := client(t, nil, proxy.WithMiddleware(rec.middleware))
		for _, opts := range [][]proxy.CallOption{nil, {proxy.Idempotent(), proxy.Hedge(time.Millisecond)}} {
			_, err := invoke(ctx, c, opts...)
			wantNoInstance(t, "a call with no instance listed", err, true)
			if want := lead + "none is known"; err == nil || err.Error() != want {
				t.Errorf("a call (options %d) with no instance listed = %v; want %q", len(opts), err, want)
			}
			if addr, attempt := rec.last(); addr != "" || attempt != 0 {
				t.Errorf("a call that made no attempt names attempt %d on %q", attempt, addr)
			}
		}
	})

	// Every instance is dead and opens its breaker on its first failure:
	// the first call tries each and finds none left for the next attempt;
	// later calls find none at all.
	for _, tt := range []struct {
		n    int
		why  string
		next string // the attempt the first call found no instance for
	}{
		{1, "its only known instance has an open circuit breaker", "2"},
		{2, "both known instances have an open circuit breaker", "3"},
		{3, "all 3 known instances have an open circuit breaker", "4"},
	} {
		t.Run("all tried, then breakers open/"+tt.why, func(t *testing.T) {
			var addrs []string
			for range tt.n {
				addrs = append(addrs, deadAddr(t))
			}
			rec, log := &callRecorder{}, &attemptLog{}
			// Panic mode off: open breakers leave every instance out.
			c := client(t, addrs, proxy.WithMiddleware(rec.middleware), proxy.WithObserver(log),
				proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 4}),
				proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Hour, PanicThreshold: -1}))

			_, err := invoke(ctx, c)
			tried := log.take()
			if len(tried) != tt.n {
				t.Fatalf("the first call made attempts on %v; want one on each of the %d instances", tried, tt.n)
			}
			wantNoInstance(t, "the call that tried every instance", err, false)
			if !errors.Is(err, proxy.ErrNotSent) {
				t.Errorf("the call that tried every instance, none sent = %v; want ErrNotSent", err)
			}
			last := tried[len(tried)-1]
			want := "status 35 (channel inactive): no instance of " + service + " can take attempt " + tt.next + ": " +
				tt.why + "; attempt " + strconv.Itoa(tt.n) + " failed: cannot connect: "
			if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), last) {
				t.Errorf("the call that tried every instance = %v; want it to start %q and name %s", err, want, last)
			}
			if addr, attempt := rec.last(); addr != last || attempt != tt.n {
				t.Errorf("the call returned the error of attempt %d on %s, but the Call names attempt %d on %s", tt.n, last, attempt, addr)
			}

			for _, opts := range [][]proxy.CallOption{nil, {proxy.Idempotent(), proxy.Hedge(time.Millisecond)}} {
				_, err = invoke(ctx, c, opts...)
				wantNoInstance(t, "a call with every breaker open", err, true)
				if want := lead + tt.why; err == nil || err.Error() != want {
					t.Errorf("a call (options %d) with every breaker open = %v; want %q", len(opts), err, want)
				}
			}
			if got := log.take(); len(got) != 0 {
				t.Errorf("calls with every breaker open made attempts on %v", got)
			}
		})
	}

	// One instance shutting down, one dead whose breaker opens: after a
	// first call that reaches both, a call finds neither usable, for
	// different reasons.
	t.Run("mixed", func(t *testing.T) {
		c := client(t, []string{drainingServer(t), deadAddr(t)}, // panic mode off, as above
			proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Hour, PanicThreshold: -1}))
		if _, err := invoke(ctx, c); err == nil {
			t.Fatal("a call to a draining and a dead instance succeeded")
		}
		_, err := invoke(ctx, c)
		wantNoInstance(t, "a call with one instance draining and one broken", err, true)
		if want := lead + "of its 2 known instances, 1 is shutting down and 1 has an open circuit breaker"; err == nil || err.Error() != want {
			t.Errorf("a call with one instance draining and one broken = %v; want %q", err, want)
		}
	})

	// A hedged call whose first attempt fails before sending and whose
	// backup finds no other instance returns the first attempt's error,
	// saying first why there was no backup.
	t.Run("hedged, no backup", func(t *testing.T) {
		dead := deadAddr(t)
		rec := &callRecorder{}
		c := client(t, []string{dead, drainingServer(t)}, proxy.WithMiddleware(rec.middleware),
			proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
		if _, err := invoke(ctx, c); err == nil { // reaches both: the draining one is known as such
			t.Fatal("a call to a dead and a draining instance succeeded")
		}
		_, err := invoke(ctx, c, proxy.Idempotent(), proxy.Hedge(time.Second))
		wantNoInstance(t, "a hedged call with no instance for its backup", err, false)
		want := "status 35 (channel inactive): no instance of " + service + " can take attempt 2: " +
			"of its 2 known instances, 1 is shutting down and 1 was already tried; attempt 1 failed: "
		if err == nil || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), dead) {
			t.Errorf("a hedged call with no instance for its backup = %v; want it to start %q and name %s", err, want, dead)
		}
		if addr, attempt := rec.last(); addr != dead || attempt != 1 {
			t.Errorf("the hedged call returned the error of attempt 1 on %s, but the Call names attempt %d on %s", dead, attempt, addr)
		}
	})
}

// TestMiddlewareErrorIsAStatus: an error a middleware makes of its own
// reaches the caller as a *protocol.Error, as every error from Invoke is,
// with the middleware's error still matchable.
func TestMiddlewareErrorIsAStatus(t *testing.T) {
	denied := errors.New("denied by policy")
	tests := []struct {
		name   string
		err    error
		status protocol.Status
		is     error
	}{
		{"own error", denied, protocol.StatusClientError, proxy.ErrBadRequest},
		{"wrapped", fmt.Errorf("auth: %w", denied), protocol.StatusClientError, proxy.ErrBadRequest},
		{"deadline", context.DeadlineExceeded, protocol.StatusServerTimeout, proxy.ErrTimeout},
		{"cancelled", context.Canceled, protocol.StatusClientError, proxy.ErrCanceled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mw := func(proxy.Invoker) proxy.Invoker {
				return func(context.Context, *proxy.Call) error { return tt.err }
			}
			c := client(t, nil, proxy.WithMiddleware(mw))
			_, err := invoke(context.Background(), c)
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Status != tt.status || pe.Remote {
				t.Fatalf("Invoke = %v (%T); want a local %d", err, err, tt.status)
			}
			if !errors.Is(err, tt.err) || !errors.Is(err, tt.is) {
				t.Errorf("Invoke = %v; want it to match %v and %v", err, tt.err, tt.is)
			}
		})
	}
	// A middleware passing on a status error keeps it as it is.
	notFound := &protocol.Error{Status: protocol.StatusServiceNotFound, Remote: true}
	c := client(t, nil, proxy.WithMiddleware(func(proxy.Invoker) proxy.Invoker {
		return func(context.Context, *proxy.Call) error { return fmt.Errorf("mw: %w", notFound) }
	}))
	if _, err := invoke(context.Background(), c); !errors.Is(err, proxy.ErrNotFound) {
		t.Errorf("a wrapped status error = %v; want it kept (ErrNotFound)", err)
	}
}
