package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// keyOwnedBy returns a hash key that a consistent hash balancer over the
// instances client makes of addrs routes to want. It asks a balancer of
// its own, not the client: a call would dial the addresses, and a dead
// one would then sit in dial backoff, which leaves it out of balancing.
func keyOwnedBy(t *testing.T, addrs []string, want string) string {
	t.Helper()
	b, err := balancer.New(balancer.ConsistentHash, balancer.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var ins []registry.Instance
	for _, a := range addrs {
		ins = append(ins, registry.Instance{Service: service, ID: a, Addr: a})
	}
	slices.SortFunc(ins, registry.CompareInstances) // as the registry cache delivers them
	b.Update(ins)
	for i := range 64 {
		key := fmt.Sprint("key-", i)
		in, done, err := b.Pick(context.Background(), key)
		if err != nil {
			t.Fatal(err)
		}
		done(0, nil)
		if in.Addr == want {
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
	key := keyOwnedBy(t, []string{a, dead}, a)

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
	key := keyOwnedBy(t, []string{a, dead}, a)

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

func TestFailoverWhenNotSent(t *testing.T) {
	s := &seen{}
	live := serve(t, s, 0, transport.ServerConfig{})
	c := client(t, []string{deadAddr(t), live})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for i := range 10 {
		got, err := invoke(ctx, c)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got != live {
			t.Fatalf("call %d answered by %q, want %q", i, got, live)
		}
	}
}

func TestFailoverWhenOverloaded(t *testing.T) {
	busy, free := &seen{}, &seen{}
	busyAddr := serve(t, busy, protocol.StatusServerThreadpoolExhausted, transport.ServerConfig{MaxConcurrent: 1})
	freeAddr := serve(t, free, 0, transport.ServerConfig{})
	c := client(t, []string{busyAddr, freeAddr})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Occupy busy's only slot: a call that lands there blocks its handler
	// until cleanup (the caller itself gives up after 100ms).
	for busy.runs.Load() == 0 {
		if ctx.Err() != nil {
			t.Fatal("no call reached the busy server")
		}
		invoke(ctx, c, proxy.Timeout(100*time.Millisecond), proxy.FailFast())
	}
	for i := range 6 {
		got, err := invoke(ctx, c)
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if got != freeAddr {
			t.Fatalf("call %d answered by %q, want %q", i, got, freeAddr)
		}
	}
	if n := busy.runs.Load(); n != 1 {
		t.Fatalf("busy server ran %d calls, want only the blocking one", n)
	}
}

func TestNoRetryAfterTheServerActed(t *testing.T) {
	s1, s2 := &seen{}, &seen{}
	a1 := serve(t, s1, protocol.StatusServiceError, transport.ServerConfig{})
	a2 := serve(t, s2, protocol.StatusServiceError, transport.ServerConfig{})
	c := client(t, []string{a1, a2})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := invoke(ctx, c)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusServiceError || !pe.Remote {
		t.Fatalf("got %v, want a remote status 70", err)
	}
	if n := s1.runs.Load() + s2.runs.Load(); n != 1 {
		t.Fatalf("the call ran %d times, want once", n)
	}
}

func TestRetryAfterTimeoutOnlyWhenIdempotent(t *testing.T) {
	slow, fast := &seen{}, &seen{}
	slowAddr := serve(t, slow, stall, transport.ServerConfig{})
	fastAddr := serve(t, fast, 0, transport.ServerConfig{})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// Round robin from a random start: the slow one is first in half the
	// calls. Every call must succeed for the idempotent method.
	c := client(t, []string{slowAddr, fastAddr}, proxy.WithBalancer("round_robin"),
		proxy.WithRetry(proxy.RetryPolicy{PerTryTimeout: 100 * time.Millisecond}),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	for i := range 6 {
		got, err := invoke(ctx, c, proxy.Idempotent(), proxy.Timeout(time.Second))
		if err != nil {
			t.Fatalf("idempotent call %d: %v", i, err)
		}
		if got != fastAddr {
			t.Fatalf("idempotent call %d answered by %q", i, got)
		}
	}
	if slow.runs.Load() == 0 {
		t.Fatal("no call tried the slow instance: the test proves nothing")
	}
	// Not idempotent: a timeout after sending is final, and the method ran
	// once.
	before := slow.runs.Load() + fast.runs.Load()
	var timedOut int
	for range 6 {
		_, err := invoke(ctx, c, proxy.Timeout(150*time.Millisecond))
		if err == nil {
			continue
		}
		var pe *protocol.Error
		if !errors.As(err, &pe) || pe.Status != protocol.StatusServerTimeout || pe.Remote {
			t.Fatalf("got %v, want a local 31", err)
		}
		timedOut++
	}
	if timedOut == 0 {
		t.Fatal("no non-idempotent call hit the slow instance")
	}
	if ran := slow.runs.Load() + fast.runs.Load() - before; ran != 6 {
		t.Fatalf("6 non-idempotent calls ran %d times", ran)
	}
}

// TestNotSentOnlyWhenNoAttemptWasSent: a call whose first attempt was
// sent (it ran on the server and timed out after sending) and whose retry
// then failed before sending (a dead instance) does not say ErrNotSent,
// "provably never left this process": it returns the error of the attempt
// that may have acted.
func TestNotSentOnlyWhenNoAttemptWasSent(t *testing.T) {
	slow := &seen{}
	slowAddr, dead := serve(t, slow, stall, transport.ServerConfig{}), deadAddr(t)
	log := &attemptLog{} // the instance of each attempt
	c := client(t, []string{slowAddr, dead}, proxy.WithBalancer("random"), proxy.WithObserver(log),
		proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 2, PerTryTimeout: 50 * time.Millisecond}),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// A call that starts on the slow instance (sent, runs there, times out
	// after 50 ms) retries on the dead one; random picks it first in half
	// the calls.
	for i := range 30 {
		_, err := invoke(ctx, c, proxy.Idempotent(), proxy.Timeout(time.Second))
		if err == nil {
			t.Fatalf("call %d succeeded against a stalled and a dead instance", i)
		}
		if got := log.take(); len(got) != 2 || got[0] != slowAddr {
			continue // not the order this test is about
		}
		if errors.Is(err, proxy.ErrNotSent) {
			t.Fatalf("call %d ran on %s (its first attempt timed out after sending), yet its error says ErrNotSent, never left this process: %v",
				i, slowAddr, err)
		}
		return
	}
	t.Fatal("no call started on the slow instance: the test proves nothing")
}

// TestRefusedCallsAreNotRetried: a rejection with code unauthenticated or
// permission_denied is returned at once, even with a status that is
// retried otherwise (100, a server-sent 31) and for an idempotent call.
func TestRefusedCallsAreNotRetried(t *testing.T) {
	for _, tc := range []struct {
		status protocol.Status
		code   string
		want   error
	}{
		{protocol.StatusBadRequest, protocol.CodeUnauthenticated, proxy.ErrUnauthenticated},
		{protocol.StatusServerThreadpoolExhausted, protocol.CodeUnauthenticated, proxy.ErrUnauthenticated},
		{protocol.StatusServerTimeout, protocol.CodePermissionDenied, proxy.ErrPermissionDenied},
	} {
		t.Run(fmt.Sprintf("%d %s", tc.status, tc.code), func(t *testing.T) {
			a1, runs1 := refusingServer(t, tc.status, tc.code)
			a2, runs2 := refusingServer(t, tc.status, tc.code)
			c := client(t, []string{a1, a2}, proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 3}))
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			_, err := invoke(ctx, c, proxy.Idempotent())
			if !errors.Is(err, tc.want) {
				t.Fatalf("got %v, want %v", err, tc.want)
			}
			if n := runs1.Load() + runs2.Load(); n != 1 {
				t.Errorf("the servers saw %d attempts, want 1", n)
			}
		})
	}
}

// attemptHook is a middleware that records what Call.OnAttempt is told.
type attemptHook struct{ infos []proxy.AttemptInfo }

func (h *attemptHook) middleware(next proxy.Invoker) proxy.Invoker {
	return func(ctx context.Context, call *proxy.Call) error {
		h.infos = nil
		call.OnAttempt = func(info proxy.AttemptInfo) { h.infos = append(h.infos, info) }
		return next(ctx, call)
	}
}

// TestOnAttempt: the hook hears each attempt as it goes out, with its
// number, instance, whether it is a hedge and the failure it follows.
func TestOnAttempt(t *testing.T) {
	t.Run("retry", func(t *testing.T) {
		live, dead := serve(t, &seen{}, 0, transport.ServerConfig{}), deadAddr(t)
		rec, hook := &callRecorder{}, &attemptHook{}
		c := client(t, []string{live, dead}, proxy.WithBalancer(balancer.ConsistentHash),
			proxy.WithMiddleware(rec.middleware, hook.middleware),
			proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		key := keyOwnedBy(t, []string{live, dead}, dead)
		if _, err := invoke(ctx, c, proxy.HashKey(key)); err != nil {
			t.Fatalf("call: %v", err)
		}
		got := hook.infos
		if len(got) != 2 {
			t.Fatalf("the hook heard %d attempts (%+v), want 2", len(got), got)
		}
		if got[0] != (proxy.AttemptInfo{Attempt: 1, Addr: dead}) {
			t.Errorf("first attempt %+v, want number 1 on %s, after nothing", got[0], dead)
		}
		if got[1].Attempt != 2 || got[1].Addr != live || got[1].Hedge || !errors.Is(got[1].After, proxy.ErrNotSent) {
			t.Errorf("second attempt %+v, want number 2 on %s, no hedge, after a failure not sent", got[1], live)
		}
	})
	t.Run("hedge", func(t *testing.T) {
		slow, fast := serve(t, &seen{}, waitCancel, transport.ServerConfig{}), serve(t, &seen{}, 0, transport.ServerConfig{})
		rec, hook := &callRecorder{}, &attemptHook{}
		c := client(t, []string{slow, fast}, proxy.WithBalancer(balancer.ConsistentHash),
			proxy.WithMiddleware(rec.middleware, hook.middleware),
			proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		defer cancel()
		key := keyOwnedBy(t, []string{slow, fast}, slow)
		got, err := invoke(ctx, c, proxy.Idempotent(), proxy.HashKey(key), proxy.Hedge(10*time.Millisecond),
			proxy.Timeout(2*time.Second))
		if err != nil || got != fast {
			t.Fatalf("hedged call answered %q, %v; want %s's answer", got, err, fast)
		}
		want := []proxy.AttemptInfo{{Attempt: 1, Addr: slow}, {Attempt: 2, Addr: fast, Hedge: true}}
		if len(hook.infos) != 2 || hook.infos[0] != want[0] || hook.infos[1] != want[1] {
			t.Errorf("the hook heard %+v, want %+v", hook.infos, want)
		}
	})
}

// A server at MaxConns closes its clients' connections to make room for
// new ones. Calls that cross those closes, of a method that is not
// idempotent, all succeed: each such request is answered 100 (not run)
// after the go-away event, and the call is sent again.
func TestEvictionsFailNoCall(t *testing.T) {
	// Each eviction waits for callsPer calls: a few retries in that many
	// calls stay within the retry budget's 10 %, on a loaded machine too.
	const clients, evictions, callsPer = 3, 100, 30
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{MaxConns: 2 * clients}) // two connections per client
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	stop := make(chan struct{})
	var calls atomic.Int64
	answered := make(chan struct{}, 1024)
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for range clients {
		c := client(t, []string{addr})
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				calls.Add(1)
				if _, err := invoke(ctx, c, proxy.Timeout(testTimeout)); err != nil {
					errs <- err
					return
				}
				select {
				case answered <- struct{}{}:
				default:
				}
			}
		})
	}
	// Each new connection takes the place of a client's, then closes.
	for range evictions {
		for range callsPer {
			select {
			case <-answered:
			case err := <-errs:
				close(stop)
				wg.Wait()
				t.Fatalf("a call failed beside the evictions: %v", err)
			case <-ctx.Done():
				t.Fatalf("%d calls answered within %v", calls.Load(), testTimeout)
			}
		}
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		_ = nc.SetDeadline(time.Now().Add(testTimeout))
		if _, err := nc.Write(protocol.AppendHeartbeat(nil, 1)); err == nil {
			var m protocol.Message
			_ = protocol.NewReader(bufio.NewReader(nc), 0).Read(&m)
		}
		_ = nc.Close()
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("a call failed beside the evictions: %v", err)
	default:
	}
	if n := s.runs.Load(); n == 0 || n > calls.Load() {
		t.Fatalf("the server ran %d calls of %d made", n, calls.Load())
	}
	t.Logf("%d calls beside %d new connections at MaxConns", calls.Load(), evictions)
}
