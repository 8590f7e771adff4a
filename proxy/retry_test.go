package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

func TestClassify(t *testing.T) {
	notSent := func(s protocol.Status) error {
		return &protocol.Error{Status: s, Err: fmt.Errorf("%w: dial refused", transport.ErrNotSent)}
	}
	tests := []struct {
		name string
		err  error
		want verdict
	}{
		{"remote overloaded", &protocol.Error{Status: protocol.StatusServerThreadpoolExhausted, Remote: true}, notActed},
		{"remote budget spent", &protocol.Error{Status: protocol.StatusServerTimeout, Remote: true}, notActed},
		{"remote service error", &protocol.Error{Status: protocol.StatusServiceError, Remote: true}, fatal},
		{"remote server error", &protocol.Error{Status: protocol.StatusServerError, Remote: true}, fatal},
		{"remote not found", &protocol.Error{Status: protocol.StatusServiceNotFound, Remote: true}, fatal},
		{"not sent: no connection", notSent(protocol.StatusChannelInactive), notActed},
		{"not sent: budget spent", notSent(protocol.StatusClientTimeout), fatal},
		{"not sent: caller gave up", notSent(protocol.StatusClientError), fatal},
		{"timed out after sending", &protocol.Error{Status: protocol.StatusServerTimeout}, unknown},
		{"connection lost after sending", &protocol.Error{Status: protocol.StatusChannelInactive}, unknown},
		{"wrapped", fmt.Errorf("middleware: %w", notSent(protocol.StatusChannelInactive)), notActed},
		{"not a protocol error", errors.New("boom"), fatal},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classify(tt.err); got != tt.want {
				t.Fatalf("classify(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestRetryBudget(t *testing.T) {
	b := newRetryBudget(0.1, 0)
	for range 1000 {
		b.call(time.Now().Unix())
	}
	allowed := 0
	for range 1000 {
		if _, ok := b.withdraw(); ok {
			allowed++
		}
	}
	if allowed != 100 {
		t.Fatalf("1000 calls allowed %d retries, want 100 (10%%)", allowed)
	}
	// The floor lets a quiet client retry.
	f := newRetryBudget(0.1, 5)
	allowed = 0
	for range 100 {
		if _, ok := f.withdraw(); ok {
			allowed++
		}
	}
	if want := 5 * budgetBuckets; allowed != want {
		t.Fatalf("no calls, floor 5/s: %d retries allowed, want %d", allowed, want)
	}
}

func TestBackoffBounds(t *testing.T) {
	p := RetryPolicy{}.withDefaults()
	for n := 1; n < 40; n++ {
		for range 50 {
			d := p.backoff(n)
			ceil := min(p.BackoffBase<<min(n-1, 16), p.BackoffMax)
			if d < 0 || d > ceil {
				t.Fatalf("backoff(%d) = %v, want within [0, %v]", n, d, ceil)
			}
		}
	}
	if p.MaxAttempts != 3 || p.BudgetRatio != 0.1 || p.BudgetFloor != 10 {
		t.Fatalf("defaults: %+v", p)
	}
	if got := (RetryPolicy{BudgetFloor: -1}).withDefaults().BudgetFloor; got != 0 {
		t.Fatalf("a negative floor means none, got %d", got)
	}
}

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
		{"dial backoff", &protocol.Error{Status: protocol.StatusChannelInactive,
			Err: fmt.Errorf("%w: %w: dial refused", transport.ErrNotSent, transport.ErrDialBackoff)}, true, true},
		{"connection refused", &protocol.Error{Status: protocol.StatusChannelInactive, Err: transport.ErrNotSent}, true, false},
		{"timed out after sending", &protocol.Error{Status: protocol.StatusServerTimeout}, true, false},
		{"caller gave up", &protocol.Error{Status: protocol.StatusClientError}, false, true},
		{"budget spent before sending", &protocol.Error{Status: protocol.StatusClientTimeout, Err: transport.ErrNotSent}, false, true},
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
	const addr = "10.0.0.1:20880"
	fail := &protocol.Error{Status: protocol.StatusServerError, Remote: true}
	_, _ = b.get(addr).cb.Execute(func() (struct{}, error) { return struct{}{}, fail })
	if !b.open(addr) {
		t.Fatal("breaker not open after a failure with ConsecutiveFailures 1")
	}
	time.Sleep(30 * time.Millisecond) // past OpenTimeout: the breaker turns half-open
	if b.open(addr) {
		t.Fatal("a half-open breaker with no probe taken is left out")
	}
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
