package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"testing"
	"time"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

// retriesCounted sums the retries the budget holds in its window.
func (b *retryBudget) retriesCounted() int64 {
	var n int64
	for i := range b.buckets {
		n += b.buckets[i].retries.Load() + b.buckets[i].floored.Load()
	}
	return n
}

// TestRetryThatNeverGoesOutIsRefunded: a retry the budget allowed but that
// found no instance to go to (the only one's breaker opened on the first
// failure) does not stay counted against the budget, which is shared by
// every call of the client: during an outage such retries would use up
// what calls with somewhere to go are allowed.
func TestRetryThatNeverGoesOutIsRefunded(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	const svc = "test.Refund"
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	for _, hedge := range []bool{false, true} {
		c, err := NewClient(static.New(registry.Instance{Service: svc, ID: dead, Addr: dead}),
			WithLogger(slog.New(slog.DiscardHandler)),
			WithRetry(RetryPolicy{MaxAttempts: 3}),
			WithBreaker(BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Hour, PanicThreshold: -1})) // a retry finds no instance
		if err != nil {
			t.Fatal(err)
		}
		var opts []CallOption
		if hedge {
			opts = []CallOption{Idempotent(), Hedge(time.Hour)} // the backup follows the first's failure
		}
		err = c.Invoke(ctx, svc, "M", &pb.StockRequest{Sku: "x"}, new(pb.StockReply), opts...)
		if !errors.Is(err, ErrUnavailable) {
			t.Errorf("hedge %v: a call to a dead instance = %v; want ErrUnavailable", hedge, err)
		}
		if n := c.budget.retriesCounted(); n != 0 {
			t.Errorf("hedge %v: the retry budget counts %d retries after a call whose retry found no instance; want 0", hedge, n)
		}
		c.Close()
	}
}

// TestAttemptsResult: the error a call returns is the latest attempt's,
// except that a sent attempt outranks a later unsent one; the Call names
// the attempt whose outcome it returns.
func TestAttemptsResult(t *testing.T) {
	sent := &protocol.Error{Status: protocol.StatusServerTimeout}
	sent2 := &protocol.Error{Status: protocol.StatusChannelInactive}
	unsent := protocol.NotSent(protocol.StatusChannelInactive, "dial refused", nil)
	unsent2 := protocol.NotSent(protocol.StatusChannelInactive, "breaker open", nil)
	tests := []struct {
		name    string
		errs    []error // one per attempt; nil is a success
		want    error
		attempt int
	}{
		{"one unsent", []error{unsent}, unsent, 1},
		{"unsent, then sent", []error{unsent, sent}, sent, 2},
		{"sent, then unsent", []error{sent, unsent}, sent, 1},
		{"sent, unsent, unsent", []error{sent, unsent, unsent2}, sent, 1},
		{"sent, then sent", []error{sent, sent2}, sent2, 2},
		{"unsent, then unsent", []error{unsent, unsent2}, unsent2, 2},
		{"failure, then success", []error{sent, nil}, nil, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			call := &Call{}
			a := attempts{c: &Client{}, call: call}
			for i, err := range tt.errs {
				addr := fmt.Sprintf("10.0.0.%d:20880", i+1)
				a.record(addr, a.start(addr), err)
			}
			if got := a.result(); got != tt.want {
				t.Errorf("result() = %v, want %v", got, tt.want)
			}
			if want := fmt.Sprintf("10.0.0.%d:20880", tt.attempt); call.Attempt != tt.attempt || call.Addr != want {
				t.Errorf("the Call names attempt %d on %s, want %d on %s", call.Attempt, call.Addr, tt.attempt, want)
			}
			if n := len(a.tried()); n != len(tt.errs) {
				t.Errorf("tried() holds %d addresses after %d attempts", n, len(tt.errs))
			}
		})
	}
}

// TestAttemptsKeepTheDialFailure: a retry on the only instance, refused
// because the dial there failed moments ago, does not replace that dial's
// failure (a TLS handshake's cause, say) with "not dialing again yet".
func TestAttemptsKeepTheDialFailure(t *testing.T) {
	const addr = "10.0.0.1:20880"
	dial := protocol.NotSent(protocol.StatusChannelInactive, "TLS handshake with "+addr+" failed: unknown authority", nil)
	backoff := protocol.NotSent(protocol.StatusChannelInactive, "not dialing "+addr+" again yet",
		fmt.Errorf("%w: %w", transport.ErrDialBackoff, dial))
	call := &Call{}
	a := attempts{c: &Client{}, call: call}
	a.record(addr, a.start(addr), dial)
	a.record(addr, a.start(addr), backoff)
	if got := a.result(); got != dial {
		t.Errorf("result() = %v, want the dial's failure %v", got, dial)
	}
	if call.Attempt != 1 {
		t.Errorf("the Call names attempt %d, want 1, the dial's", call.Attempt)
	}
	other := attempts{c: &Client{}, call: &Call{}}
	other.record(addr, other.start(addr), dial)
	other.record("10.0.0.2:20880", other.start("10.0.0.2:20880"), backoff)
	if got := other.result(); got != backoff {
		t.Errorf("a refusal on another address: result() = %v, want it", got)
	}
}

// TestAttemptsRetry: one decision per attempt, drawing on the budget when
// it allows another; result refunds a withdrawal whose attempt never went
// out, and start spends it.
func TestAttemptsRetry(t *testing.T) {
	unsent := protocol.NotSent(protocol.StatusChannelInactive, "dial refused", nil)
	timedOut := &protocol.Error{Status: protocol.StatusServerTimeout}
	served := &protocol.Error{Status: protocol.StatusServiceError, Remote: true}
	tests := []struct {
		name       string
		call       Call
		made       int // attempts made before the decision
		err        error
		cancel     bool
		want       bool
		maxAttempt int
	}{
		{"not sent", Call{}, 1, unsent, false, true, 3},
		{"not sent, last attempt", Call{}, 3, unsent, false, false, 3},
		{"not sent, fail fast", Call{FailFast: true}, 1, unsent, false, false, 3},
		{"not sent, caller gone", Call{}, 1, unsent, true, false, 3},
		{"unknown outcome, idempotent", Call{Idempotent: true}, 1, timedOut, false, true, 3},
		{"unknown outcome, not idempotent", Call{}, 1, timedOut, false, false, 3},
		{"the server acted", Call{Idempotent: true}, 1, served, false, false, 3},
		{"no answer yet (a hedge)", Call{FailFast: true}, 1, nil, false, true, 3},
		{"no answer yet, retries off", Call{}, 1, nil, false, false, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Client{budget: newRetryBudget(0.1, 10)}
			c.opts.retry = RetryPolicy{MaxAttempts: tt.maxAttempt}.withDefaults()
			call := tt.call
			call.Deadline = time.Now().Add(time.Minute)
			a := attempts{c: c, call: &call}
			for range tt.made {
				a.record("10.0.0.1:20880", a.start("10.0.0.1:20880"), tt.err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			if tt.cancel {
				cancel()
			}
			defer cancel()
			if got := a.retry(ctx, tt.err); got != tt.want {
				t.Fatalf("retry = %v, want %v", got, tt.want)
			}
			want := int64(0)
			if tt.want {
				want = 1
			}
			if n := c.budget.retriesCounted(); n != want {
				t.Fatalf("the budget counts %d retries after the decision, want %d", n, want)
			}
			_ = a.result() // the retry never goes out
			if n := c.budget.retriesCounted(); n != 0 {
				t.Errorf("the budget counts %d retries after result, want 0: a retry that never went out is refunded", n)
			}
		})
	}
	t.Run("a retry that goes out stays counted", func(t *testing.T) {
		c := &Client{budget: newRetryBudget(0.1, 10)}
		c.opts.retry = RetryPolicy{}.withDefaults()
		call := Call{Deadline: time.Now().Add(time.Minute)}
		a := attempts{c: c, call: &call}
		a.record("a", a.start("a"), unsent)
		if !a.retry(context.Background(), unsent) {
			t.Fatal("retry refused after an unsent first attempt")
		}
		a.record("b", a.start("b"), unsent)
		_ = a.result()
		if n := c.budget.retriesCounted(); n != 1 {
			t.Errorf("the budget counts %d retries, want 1", n)
		}
	})
}

// TestAttemptOnUnlistedAddress: an attempt on an address its service no
// longer lists (picked from a list an update replaced, after the address's
// health was dropped) is not sent and leaves no health behind; one on a
// listed address goes out.
func TestAttemptOnUnlistedAddress(t *testing.T) {
	const svc = "test.Unlisted"
	const listed, gone = "127.0.0.1:1", "127.0.0.1:2"
	c, err := NewClient(static.New(registry.Instance{Service: svc, ID: listed, Addr: listed}), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.service(ctx, svc, time.Now().Add(time.Second)); err != nil {
		t.Fatal(err)
	}
	call := &Call{Service: svc}
	var done int
	ran := false
	err = c.guarded(call, gone, func(time.Duration, error) { done++ }, func(time.Time) error { ran = true; return nil })
	if ran || !errors.Is(err, ErrNotSent) || !errors.Is(err, errUnlisted) {
		t.Fatalf("attempt on an unlisted address: ran %v, err %v; want not sent, errUnlisted", ran, err)
	}
	if done != 1 {
		t.Fatalf("the balancer was told of the attempt %d times, want 1", done)
	}
	if h := (*c.breakers.m.Load())[gone]; h != nil {
		t.Fatal("the unlisted address kept a health entry")
	}
	if err := c.guarded(call, listed, func(time.Duration, error) {}, func(time.Time) error { ran = true; return nil }); err != nil || !ran {
		t.Fatalf("attempt on a listed address: ran %v, err %v", ran, err)
	}
}
