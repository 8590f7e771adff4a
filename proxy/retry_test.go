package proxy

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func TestClassify(t *testing.T) {
	notSent := func(s protocol.Status) error {
		return protocol.NotSent(s, "dial refused", nil)
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
		// A code never makes a call retryable; these two make it fatal.
		{"remote overloaded, unauthenticated", &protocol.Error{Status: protocol.StatusServerThreadpoolExhausted,
			Code: protocol.CodeUnauthenticated, Remote: true}, fatal},
		{"remote budget spent, permission denied", &protocol.Error{Status: protocol.StatusServerTimeout,
			Code: protocol.CodePermissionDenied, Remote: true}, fatal},
		{"remote overloaded, other code", &protocol.Error{Status: protocol.StatusServerThreadpoolExhausted,
			Code: protocol.CodeResourceExhausted, Remote: true}, notActed},
		{"remote service error, retryable-sounding code", &protocol.Error{Status: protocol.StatusServiceError,
			Code: "unavailable", Remote: true}, fatal},
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
