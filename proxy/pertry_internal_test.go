package proxy

import (
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry/static"
)

// TestAdaptivePerTryBounds: the adaptive per-try timeout is 3 × the
// instance's latency peak, at least 100 ms, and at most half of what the
// call has left, so one slow answer cannot hand a frozen instance most of
// the budget.
func TestAdaptivePerTryBounds(t *testing.T) {
	c, err := NewClient(static.New())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	const addr = "127.0.0.1:1"
	h := c.breakers.get(addr)
	now := time.Now()
	for range perTryWarm {
		h.latency.observe(time.Millisecond, int64(now.Sub(epoch)))
	}
	call := &Call{Idempotent: true, Attempt: 1, Deadline: now.Add(time.Second)}
	if got, ok := c.adaptivePerTry(call, addr, now); !ok || got != perTryFloor {
		t.Fatalf("a 1 ms peak: per-try %v (applies %v), want the %v floor", got, ok, perTryFloor)
	}
	h.latency.observe(100*time.Millisecond, int64(now.Sub(epoch)))
	if got, _ := c.adaptivePerTry(call, addr, now); got < 299*time.Millisecond || got > 300*time.Millisecond {
		t.Fatalf("a 100 ms peak: per-try %v, want 3 × 100ms", got)
	}
	h.latency.observe(400*time.Millisecond, int64(now.Sub(epoch)))
	if got, _ := c.adaptivePerTry(call, addr, now); got != 500*time.Millisecond {
		t.Fatalf("a 400 ms peak with 1 s left: per-try %v, want half of what is left, 500ms", got)
	}
	call.Attempt = c.opts.retry.MaxAttempts
	if _, ok := c.adaptivePerTry(call, addr, now); ok {
		t.Fatal("the last attempt got an adaptive per-try timeout; it may use all that remains")
	}
}
