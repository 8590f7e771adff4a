package main

import (
	"strings"
	"testing"
	"time"
)

// TestWindows: calls fall in the window in which they began; the baseline
// is the p99 of the 2 s before the freeze; the worst window is looked for
// from 2 s after the freeze, leaving out the last; calls that tried the
// frozen provider are counted per window and from 2 s on.
func TestWindows(t *testing.T) {
	const frozen = "127.0.0.1:2"
	r := &result{frozen: frozen, froze: true}
	add := func(start, took time.Duration, addrs ...string) {
		c := callRec{start: start, took: took}
		for _, a := range addrs {
			c.attempts = append(c.attempts, attemptRec{addr: a})
		}
		r.calls = append(r.calls, c)
	}
	for i := range 200 {
		add(-2*time.Second+time.Duration(i)*10*time.Millisecond, time.Millisecond) // baseline: 1 ms
	}
	add(-3*time.Second, time.Second) // before the baseline: left out
	for i := range 100 {
		add(time.Duration(i)*10*time.Millisecond, time.Millisecond)
	}
	add(100*time.Millisecond, 150*time.Millisecond, frozen, "127.0.0.1:1") // in the first 2 s
	for i := range 100 {
		add(2*time.Second+time.Duration(i)*10*time.Millisecond, time.Millisecond)
	}
	add(2500*time.Millisecond, 3*time.Millisecond)
	add(2510*time.Millisecond, 120*time.Millisecond, frozen, "127.0.0.1:1")
	add(5*time.Second, 9*time.Second) // the last window: left out

	if b := r.baseline(); b != time.Millisecond {
		t.Fatalf("baseline %v, want 1ms", b)
	}
	w := r.worst(250 * time.Millisecond)
	if w.from != 2500*time.Millisecond || w.p99 != 120*time.Millisecond || w.frozen != 1 || w.retried != 1 {
		t.Fatalf("worst window %+v, want the one at 2.5s with p99 120ms and one call on the frozen provider", w)
	}
	if n, longest := r.late(); n != 1 || longest != 120*time.Millisecond {
		t.Fatalf("late() = %d, %v; want 1 call of 120ms", n, longest)
	}
	ws := r.windows(250 * time.Millisecond)
	if ws[0].from != -2*time.Second || ws[0].calls != 25 {
		t.Fatalf("first window %+v, want 25 calls from -2s", ws[0])
	}
	var out strings.Builder
	r.summary(&out)
	if !strings.Contains(out.String(), "+2.5s p99 120ms (120.00x, max 120ms; the client process stalled 0s in it)") {
		t.Fatalf("summary %q does not name the worst window", out.String())
	}
}
