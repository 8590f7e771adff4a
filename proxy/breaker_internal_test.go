package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

func TestBreakerClasses(t *testing.T) {
	tests := []struct {
		name              string
		err               error
		failure, excluded bool
	}{
		{"success", nil, false, false},
		{"application error", &protocol.Error{Status: protocol.StatusServiceError, Remote: true}, false, false},
		{"server error", &protocol.Error{Status: protocol.StatusServerError, Remote: true}, true, false},
		// A shed call counts for the balancer (failure) but not for the breaker.
		{"overloaded", &protocol.Error{Status: protocol.StatusServerThreadpoolExhausted, Remote: true}, true, true},
		{"dial backoff", protocol.NotSent(protocol.StatusChannelInactive, "not dialing again yet",
			fmt.Errorf("%w: dial refused", transport.ErrDialBackoff)), true, true},
		{"connection refused", protocol.NotSent(protocol.StatusChannelInactive, "dial refused", nil), true, false},
		{"timed out after sending", &protocol.Error{Status: protocol.StatusServerTimeout}, true, false},
		{"caller gave up", &protocol.Error{Status: protocol.StatusClientError}, false, true},
		{"budget spent before sending", protocol.NotSent(protocol.StatusClientTimeout, "budget spent", nil), false, true},
		// A rejection of the caller counts as a success whatever its status.
		{"unauthenticated", &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodeUnauthenticated, Remote: true}, false, false},
		{"permission denied as 80", &protocol.Error{Status: protocol.StatusServerError, Code: protocol.CodePermissionDenied, Remote: true}, false, false},
		{"server error with another code", &protocol.Error{Status: protocol.StatusServerError, Code: "db_down", Remote: true}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := instanceFailure(tt.err); got != tt.failure {
				t.Errorf("instanceFailure = %v, want %v", got, tt.failure)
			}
			if got := excludedFromBreaker(tt.err); got != tt.excluded {
				t.Errorf("excludedFromBreaker = %v, want %v", got, tt.excluded)
			}
		})
	}
}

// TestHalfOpenWithProbeInFlightIsUnavailable: while a half-open breaker's
// probe is in flight the instance is left out, instead of being picked
// and refused by the breaker.
func TestHalfOpenWithProbeInFlightIsUnavailable(t *testing.T) {
	b := newBreakers(BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: 20 * time.Millisecond}, slog.New(slog.DiscardHandler), nil)
	defer b.close()
	const addr = "10.0.0.1:20880"
	fail := &protocol.Error{Status: protocol.StatusServerError, Remote: true}
	_, _ = b.get(addr).cb.Execute(func() (struct{}, error) { return struct{}{}, fail })
	if !b.open(addr) {
		t.Fatal("breaker not open after a failure with ConsecutiveFailures 1")
	}
	// Past OpenTimeout the heartbeat (none here: b.ping is nil) turns the
	// breaker half-open. One with no probe taken is offered.
	wait.Until(t, breakerTestTimeout, time.Millisecond, "the half-open breaker to be offered", func() bool { return !b.open(addr) })
	// A probe whose outcome says nothing of the instance (the caller gave
	// up) frees its slot: the next probe may go.
	gaveUp := &protocol.Error{Status: protocol.StatusClientError, Err: context.Canceled}
	_, _ = b.get(addr).cb.Execute(func() (struct{}, error) { return struct{}{}, gaveUp })
	if b.open(addr) {
		t.Fatal("a half-open breaker whose only probe was excluded is left out for good")
	}
	entered, release := make(chan struct{}), make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = b.get(addr).cb.Execute(func() (struct{}, error) {
			close(entered)
			<-release
			return struct{}{}, nil
		})
	}()
	<-entered
	if !b.open(addr) {
		t.Error("a half-open breaker whose probe is in flight is offered to the balancer")
	}
	close(release)
	<-done
	if b.open(addr) {
		t.Error("the breaker is still left out after its probe succeeded")
	}
}

// TestPanicThreshold: the service panics, and balancing ignores its
// breakers, once the share of its instances with tripped breakers reaches
// PanicThreshold; a negative threshold never panics.
func TestPanicThreshold(t *testing.T) {
	addrs := []string{"10.0.0.1:20880", "10.0.0.2:20880", "10.0.0.3:20880", "10.0.0.4:20880"}
	for _, tt := range []struct {
		threshold float64
		tripped   int
		want      bool
	}{
		{0, 0, false}, {0, 3, false}, {0, 4, true}, // default: all of them
		{1, 4, true},
		{0.5, 1, false}, {0.5, 2, true}, {0.5, 3, true},
		{-1, 4, false},
	} {
		t.Run(fmt.Sprintf("threshold %v, %d of 4 tripped", tt.threshold, tt.tripped), func(t *testing.T) {
			c, err := NewClient(nil, WithLogger(slog.New(slog.DiscardHandler)),
				WithBreaker(BreakerConfig{PanicThreshold: tt.threshold}))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			st := &serviceState{}
			ins := make([]registry.Instance, len(addrs))
			for i, a := range addrs {
				ins[i] = registry.Instance{ID: a, Addr: a}
			}
			st.ins.Store(&ins)
			for _, a := range addrs[:tt.tripped] {
				c.breakers.get(a).tripped.Store(true)
				c.breakers.gen.Add(1) // as OnStateChange does
			}
			if got := c.panicking(st); got != tt.want {
				t.Fatalf("panicking = %v, want %v", got, tt.want)
			}
			if tt.tripped > 0 {
				// A breaker that goes makes the verdict stale: one fewer
				// is tripped now.
				c.breakers.drop(addrs[0])
				th := c.breakers.cfg.PanicThreshold
				want := th >= 0 && tt.tripped > 1 && float64(tt.tripped-1) >= th*4
				if got := c.panicking(st); got != want {
					t.Fatalf("after a tripped breaker went: panicking = %v, want %v", got, want)
				}
			}
		})
	}
}

// TestQuietBreakerIsBypassed: attempts on a closed breaker with no failure
// in its run do not go through gobreaker (its lock and two clock reads per
// attempt serialised 512 callers of one instance); a failure is told to it,
// the next attempt goes through it and its success ends the run; with
// FailureRatio set every attempt goes through it.
func TestQuietBreakerIsBypassed(t *testing.T) {
	const addr = "10.0.0.1:20880"
	fail := &protocol.Error{Status: protocol.StatusServerError, Remote: true}
	b := newBreakers(BreakerConfig{}, slog.New(slog.DiscardHandler), nil)
	h := b.get(addr)
	if !b.quiet(h) {
		t.Fatal("a new breaker is not quiet")
	}
	h.fail(fail)
	if b.quiet(h) || h.cb.Counts().ConsecutiveFailures != 1 {
		t.Fatalf("after a failure: quiet %v, counts %+v", b.quiet(h), h.cb.Counts())
	}
	_, _ = h.cb.Execute(func() (struct{}, error) { return struct{}{}, nil })
	h.settle(nil)
	if !b.quiet(h) {
		t.Fatalf("a success after the failure left the breaker loud: counts %+v", h.cb.Counts())
	}
	ratio := newBreakers(BreakerConfig{FailureRatio: 0.5}, slog.New(slog.DiscardHandler), nil)
	if ratio.quiet(ratio.get(addr)) {
		t.Fatal("with FailureRatio set, attempts bypass the breaker that must count them all")
	}
}

// get returns the health of addr, creating it on first use.
func (b *breakers) get(addr string) *instanceHealth {
	h, _ := b.lookup(addr)
	return h
}

// TestOpenPeriodGrows: an open breaker sends a heartbeat at the end of
// each open period and takes no call meanwhile, nor while the heartbeat
// is out. Each heartbeat left unanswered doubles the period, up to
// MaxOpenTimeout. An answer turns it half-open, and a call may probe. A
// trip soon after it closed doubles the last period again; one after the
// instance stayed closed for that long starts from OpenTimeout.
func TestOpenPeriodGrows(t *testing.T) {
	const addr = "10.0.0.1:20880"
	b := newBreakers(BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: 5 * time.Millisecond, MaxOpenTimeout: 20 * time.Millisecond},
		slog.New(slog.DiscardHandler), nil)
	defer b.close()
	pings := make(chan string)
	answers := make(chan error)
	b.ping = func(ctx context.Context, a string) error {
		select {
		case pings <- a:
			return <-answers
		case <-ctx.Done(): // the test ended with a heartbeat due
			return ctx.Err()
		}
	}
	heartbeat := func(answer error) {
		t.Helper()
		select {
		case a := <-pings:
			if a != addr {
				t.Fatalf("heartbeat to %s, want %s", a, addr)
			}
		case <-time.After(breakerTestTimeout):
			t.Fatal("no heartbeat at the end of the open period")
		}
		if !b.open(addr) {
			t.Fatal("the instance is offered to the balancer while its heartbeat is out")
		}
		answers <- answer
	}
	fail := &protocol.Error{Status: protocol.StatusServerError, Remote: true}
	h := b.get(addr)
	h.fail(fail)
	if !b.open(addr) || h.openPeriod() != 5*time.Millisecond {
		t.Fatalf("after a failure: open %v, period %v; want open for 5ms", b.open(addr), h.openPeriod())
	}
	for _, want := range []time.Duration{10 * time.Millisecond, 20 * time.Millisecond, 20 * time.Millisecond} {
		heartbeat(errors.New("no answer"))
		// The next heartbeat is armed once the period is set.
		wait.Until(t, breakerTestTimeout, time.Millisecond, "the breaker to open again", func() bool { return h.cb.State() == gobreaker.StateOpen })
		if got := h.openPeriod(); got != want {
			t.Fatalf("open period %v after an unanswered heartbeat, want %v", got, want)
		}
		if !b.open(addr) {
			t.Fatal("the instance is offered to the balancer before it answered a heartbeat")
		}
	}
	heartbeat(nil)
	wait.Until(t, breakerTestTimeout, time.Millisecond, "the instance to be offered after it answered", func() bool { return !b.open(addr) })
	// The call that probes fails: open again, for twice the last period
	// (capped).
	if _, err := h.cb.Execute(func() (struct{}, error) { return struct{}{}, fail }); err != fail {
		t.Fatalf("the probe call = %v, want it run", err)
	}
	if !b.open(addr) || h.openPeriod() != 20*time.Millisecond {
		t.Fatalf("after a failed probe: open %v, period %v; want open for 20ms", b.open(addr), h.openPeriod())
	}
	heartbeat(nil)
	wait.Until(t, breakerTestTimeout, time.Millisecond, "the instance to be offered after it answered", func() bool { return !b.open(addr) })
	if _, err := h.cb.Execute(func() (struct{}, error) { return struct{}{}, nil }); err != nil {
		t.Fatal(err)
	}
	if h.cb.State() != gobreaker.StateClosed {
		t.Fatalf("breaker %s after a successful probe, want closed", h.cb.State())
	}
	// A trip right after it closed: the instance is still unwell.
	h.fail(fail)
	if got := h.openPeriod(); got != 20*time.Millisecond {
		t.Fatalf("open period %v after a trip right after closing, want 20ms", got)
	}
	heartbeat(nil)
	wait.Until(t, breakerTestTimeout, time.Millisecond, "the instance to be offered after it answered", func() bool { return !b.open(addr) })
	if _, err := h.cb.Execute(func() (struct{}, error) { return struct{}{}, nil }); err != nil {
		t.Fatal(err)
	}
	// Closed for longer than the last period: back to OpenTimeout.
	h.probe.Lock()
	h.closedAt = h.closedAt.Add(-time.Minute)
	h.probe.Unlock()
	h.fail(fail)
	if got := h.openPeriod(); got != 5*time.Millisecond {
		t.Fatalf("open period %v after a trip long after closing, want 5ms", got)
	}
}

// breakerTestTimeout bounds the waits of the internal breaker tests.
const breakerTestTimeout = 10 * time.Second
