package proxy_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

// callRecorder is a middleware that keeps what the Call says of its
// attempt once next returns, as a middleware that blames an instance reads
// it.
type callRecorder struct {
	mu      sync.Mutex
	addr    string
	attempt int
}

func (r *callRecorder) middleware(next proxy.Invoker) proxy.Invoker {
	return func(ctx context.Context, call *proxy.Call) error {
		err := next(ctx, call)
		r.mu.Lock()
		r.addr, r.attempt = call.Addr, call.Attempt
		r.mu.Unlock()
		return err
	}
}

func (r *callRecorder) last() (string, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr, r.attempt
}

// attemptLog is an Observer that records the instance of every attempt,
// in the order the attempts end.
type attemptLog struct {
	mu    sync.Mutex
	addrs []string
}

func (o *attemptLog) Attempted(_, _, addr string, _ protocol.Status, _ time.Duration) {
	o.mu.Lock()
	o.addrs = append(o.addrs, addr)
	o.mu.Unlock()
}
func (o *attemptLog) Retried(string, string, protocol.Status) {}
func (o *attemptLog) BreakerChanged(string, string, string)   {}

// take returns the attempts recorded since the last take.
func (o *attemptLog) take() []string {
	o.mu.Lock()
	defer o.mu.Unlock()
	got := o.addrs
	o.addrs = nil
	return got
}

// keyOwnedBy returns a hash key that c's consistent hash balancer routes
// to want, found with single-attempt calls.
func keyOwnedBy(t *testing.T, ctx context.Context, c *proxy.Client, rec *callRecorder, want string) string {
	t.Helper()
	for i := range 64 {
		key := fmt.Sprint("key-", i)
		invoke(ctx, c, proxy.HashKey(key), proxy.FailFast(), proxy.Timeout(20*time.Millisecond))
		if addr, _ := rec.last(); addr == want {
			return key
		}
	}
	t.Fatalf("no key of 64 is routed to %s", want)
	return ""
}

// localTimeout fails unless err is the local 31 of an attempt that timed
// out after sending (it may have run on the server).
func localTimeout(t *testing.T, what string, err error) {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusServerTimeout || pe.Remote || errors.Is(err, proxy.ErrNotSent) {
		t.Fatalf("%s = %v; want the local 31 of the attempt that timed out after sending", what, err)
	}
}

// TestCallNamesTheAttemptItReturns: the first attempt of an idempotent
// call is sent to A and times out (per-try timeout); the retry on B fails
// before sending (nothing listens there). The call returns A's error, as
// the server may have acted, and the Call must say so: Addr A, Attempt 1.
// It named B, attempt 2, so a middleware blamed B for A's timeout.
func TestCallNamesTheAttemptItReturns(t *testing.T) {
	a, dead := serve(t, &seen{}, waitCancel, transport.ServerConfig{}), deadAddr(t)
	rec, log := &callRecorder{}, &attemptLog{}
	c := client(t, []string{a, dead}, proxy.WithBalancer(balancer.ConsistentHash),
		proxy.WithMiddleware(rec.middleware), proxy.WithObserver(log),
		proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 2, PerTryTimeout: 50 * time.Millisecond}),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	key := keyOwnedBy(t, ctx, c, rec, a)
	log.take()

	_, err := invoke(ctx, c, proxy.Idempotent(), proxy.HashKey(key), proxy.Timeout(time.Second))
	if got := log.take(); len(got) != 2 || got[0] != a || got[1] != dead {
		t.Fatalf("attempts went to %v; want %s then %s: the test proves nothing", got, a, dead)
	}
	localTimeout(t, "the call", err)
	if addr, attempt := rec.last(); addr != a || attempt != 1 {
		t.Errorf("the call returned the error of attempt 1 on %s, but the Call names attempt %d on %s", a, attempt, addr)
	}
}

// TestHedgedCallNamesTheAttemptItReturns: a hedged call whose first
// attempt (on A) hangs until it times out and whose backup (on B) fails
// before sending returns A's error; the Call must name attempt 1 on A.
// It named attempt 2, the backup's number.
func TestHedgedCallNamesTheAttemptItReturns(t *testing.T) {
	a, dead := serve(t, &seen{}, waitCancel, transport.ServerConfig{}), deadAddr(t)
	rec, log := &callRecorder{}, &attemptLog{}
	c := client(t, []string{a, dead}, proxy.WithBalancer(balancer.ConsistentHash),
		proxy.WithMiddleware(rec.middleware), proxy.WithObserver(log),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	key := keyOwnedBy(t, ctx, c, rec, a)
	log.take()

	_, err := invoke(ctx, c, proxy.Idempotent(), proxy.HashKey(key), proxy.Hedge(10*time.Millisecond),
		proxy.Timeout(200*time.Millisecond))
	// The backup fails at once; the first attempt ends at the deadline.
	if got := log.take(); len(got) != 2 || got[0] != dead || got[1] != a {
		t.Fatalf("attempts ended on %v; want %s (the backup) then %s: the test proves nothing", got, dead, a)
	}
	localTimeout(t, "the hedged call", err)
	if addr, attempt := rec.last(); addr != a || attempt != 1 {
		t.Errorf("the hedged call returned the error of attempt 1 on %s, but the Call names attempt %d on %s", a, attempt, addr)
	}
}
