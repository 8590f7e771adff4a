// Package wait is for tests that must watch a state no event announces
// (a goroutine's table, a server-side counter): it polls, with a bound.
//
//	wait.Until(t, 2*time.Second, time.Millisecond, "the cache to go stale", func() bool {
//		return c.Stale(svc)
//	})
//
// Where an event exists (a channel, a watch), wait for it instead.
package wait

import (
	"testing"
	"time"
)

// Until calls cond every step until it reports true, and fails the test
// (t.Fatalf, naming what) if that takes longer than timeout.
func Until(t testing.TB, timeout, step time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	tick := time.NewTicker(step)
	defer tick.Stop()
	for !cond() {
		select {
		case <-deadline.C:
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		case <-tick.C:
		}
	}
}
