package proxy_test

import (
	"context"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/proxy"
)

// TestRatioBreakerOpensForDeadInstance: with a ratio-based breaker
// (FailureRatio, MinRequests), calls counted neither way (dial-backoff
// refusals, shed 100s, callers that gave up) do not dilute the ratio:
// gobreaker counts them in Requests, so an address whose every dial fails,
// each failed dial followed by dozens of refusals, never reached the ratio.
func TestRatioBreakerOpensForDeadInstance(t *testing.T) {
	dead := deadAddr(t)
	c := client(t, []string{dead}, proxy.WithBreaker(proxy.BreakerConfig{
		ConsecutiveFailures: 1 << 30, // ratio only
		FailureRatio:        0.5,
		MinRequests:         4,
	}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	tick := time.NewTicker(2 * time.Millisecond) // pacing only
	defer tick.Stop()
	dials, backedOff := 0, 0
	for dials < 5 {
		if ctx.Err() != nil {
			t.Fatalf("only %d failed dials in %v", dials, testTimeout)
		}
		if callDead(ctx, t, c) {
			backedOff++
		} else {
			dials++
		}
		if c.BreakerState(dead) != "closed" {
			return
		}
		<-tick.C
	}
	t.Errorf("breaker of an address whose %d dials all failed is still closed (%d calls refused by the dial backoff dilute the ratio); want open: every call it counted failed, FailureRatio 0.5, MinRequests 4",
		dials, backedOff)
}
