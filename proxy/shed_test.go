package proxy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

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
