package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"time"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
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
		{"not sent: per-try timeout", protocol.NotSent(protocol.StatusClientTimeout, "per-try timeout", errPerTryTimeout), notActed},
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
	const now = 1_700_000_000 // a Unix second
	withdrawals := func(b *retryBudget, sec int64, n int) int {
		allowed := 0
		for range n {
			if _, ok := b.withdraw(sec); ok {
				allowed++
			}
		}
		return allowed
	}
	t.Run("ratio", func(t *testing.T) {
		b := newRetryBudget(0.1, -1)
		b.floor = 0
		for range 1000 {
			b.call(now)
		}
		if got := withdrawals(b, now, 1000); got != 100 {
			t.Fatalf("1000 calls allowed %d retries, want 100 (10%%)", got)
		}
	})
	t.Run("floor", func(t *testing.T) {
		// The floor lets a quiet client retry.
		f := newRetryBudget(0.1, 5)
		if got, want := withdrawals(f, now, 100), 5*budgetBuckets; got != want {
			t.Fatalf("no calls, floor 5/s: %d retries allowed, want %d", got, want)
		}
	})
	t.Run("no carry-over", func(t *testing.T) {
		// Ten seconds of calls without retries, then an outage: its first
		// second gets a tenth of its own calls and the floor, nothing of
		// the earlier calls. (A sliding window once allowed 1000 here.)
		b := newRetryBudget(0.1, 10)
		for sec := int64(now - 10); sec < now; sec++ {
			for range 1000 {
				b.call(sec)
			}
		}
		for range 1000 {
			b.call(now)
		}
		if got, want := withdrawals(b, now, 1000), 100+10*budgetBuckets; got != want {
			t.Fatalf("first second of an outage: %d retries allowed, want %d (a tenth of its calls and the floor)", got, want)
		}
		// The next second: a tenth of its calls; the floor is spent.
		for range 1000 {
			b.call(now + 1)
		}
		if got := withdrawals(b, now+1, 1000); got != 100 {
			t.Fatalf("second second of an outage: %d retries allowed, want 100", got)
		}
	})
	t.Run("refund", func(t *testing.T) {
		b := newRetryBudget(0.1, 1)
		for range 10 {
			b.call(now)
		}
		r, ok := b.withdraw(now)  // the ratio's one
		f, ok2 := b.withdraw(now) // the floor's first
		if !ok || !ok2 {
			t.Fatal("withdrawals refused")
		}
		b.refund(r)
		b.refund(f)
		if got, want := withdrawals(b, now, 100), 1+budgetBuckets; got != want {
			t.Fatalf("after two refunds: %d retries allowed, want %d", got, want)
		}
	})
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

// perSecond counts events by the Unix second they started in.
type perSecond struct {
	mu sync.Mutex
	n  map[int64]int64
}

func (p *perSecond) add(at time.Time) {
	p.mu.Lock()
	if p.n == nil {
		p.n = map[int64]int64{}
	}
	p.n[at.Unix()]++
	p.mu.Unlock()
}

// since sums the counts from second s on.
func (p *perSecond) since(s int64) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for sec, k := range p.n {
		if sec >= s {
			n += k
		}
	}
	return n
}

// attemptStarts is an Observer that counts attempts by the second they
// started in.
type attemptStarts struct{ perSecond }

func (o *attemptStarts) Attempted(_, _, _ string, _ protocol.Status, latency time.Duration) {
	o.add(time.Now().Add(-latency))
}
func (o *attemptStarts) Retried(string, string, protocol.Status) {}
func (o *attemptStarts) BreakerChanged(string, string, string)   {}

// TestRetryBudgetFromTheFirstSecondOfAnOutage: after a warm period of
// successful calls the whole service goes down (connection refused, no
// breakers). From the second the outage starts in, attempts stay within
// calls × (1 + BudgetRatio) plus the floor's ten seconds (100): the calls
// before the outage lend the retries nothing.
func TestRetryBudgetFromTheFirstSecondOfAnOutage(t *testing.T) {
	const svc = "test.Outage"
	var servers []*transport.Server
	var dones []chan error
	var ins []registry.Instance
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
			resp.Payload = append(resp.Payload[:0], 10, 1, 'x') // StockReply{Sku: "x"}
		}), transport.ServerConfig{Logger: slog.New(slog.DiscardHandler)})
		done := make(chan error, 1)
		go func() { done <- srv.Serve(l) }()
		servers, dones = append(servers, srv), append(dones, done)
		ins = append(ins, registry.Instance{Service: svc, ID: l.Addr().String(), Addr: l.Addr().String()})
	}
	obs := &attemptStarts{}
	// Calls are counted by the start the budget counts them by.
	var calls perSecond
	count := func(next Invoker) Invoker {
		return func(ctx context.Context, call *Call) error {
			calls.add(call.start)
			return next(ctx, call)
		}
	}
	c, err := NewClient(static.New(ins...), WithLogger(slog.New(slog.DiscardHandler)), WithObserver(obs),
		WithMiddleware(count), WithBreaker(BreakerConfig{Disabled: true})) // the budget alone holds retries back
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	var failedWarm sync.Once
	var mu sync.Mutex
	var outage time.Time // zero until every server is down
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := c.Invoke(ctx, svc, "M", &pb.StockRequest{Sku: "x"}, new(pb.StockReply), Idempotent())
				mu.Lock()
				down := !outage.IsZero()
				mu.Unlock()
				if err != nil && !down {
					failedWarm.Do(func() { t.Errorf("a call failed before the outage: %v", err) })
				}
			}
		})
	}
	// A warm second and a half of successful calls: the old sliding
	// window carried a tenth of them into the outage.
	time.Sleep(1500 * time.Millisecond) // the load runs meanwhile; nothing to await
	mu.Lock()
	outage = time.Now()
	mu.Unlock()
	for i, srv := range servers {
		srv.Close()
		<-dones[i]
	}
	time.Sleep(1500 * time.Millisecond) // the outage lasts; nothing to await
	close(stop)
	wg.Wait()

	first := outage.Unix()
	n, attempts := calls.since(first), obs.since(first)
	// The floor: 10 retries a second, which a window of ten seconds may
	// save up. An attempt's start is read from its latency: one near a
	// second's edge may be counted in the next. A retry counted as a
	// bucket turns to a new second may be lost: one a second.
	spanned := time.Now().Unix() - first + 1
	limit := float64(n)*1.1 + 100 + float64(spanned) + 2
	t.Logf("from the outage's first second: %d calls, %d attempts; limit %.0f", n, attempts, limit)
	if float64(attempts) > limit {
		t.Fatalf("%d attempts for %d calls from the outage's first second, over calls × 1.1 + floor = %.0f",
			attempts, n, limit)
	}
	if attempts <= n {
		t.Fatal("no retries at all: the test proves nothing")
	}
}
