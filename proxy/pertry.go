// The adaptive per-try timeout: each instance's latency peak, and the timeout derived from it.

package proxy

import (
	"math"
	"sync/atomic"
	"time"
)

// The adaptive per-try timeout of an idempotent attempt, when
// RetryPolicy.PerTryTimeout is zero: the instance's latency peak times
// perTryFactor, at least perTryFloor, at most half of what the call has
// left. See docs/resilience.md.
const (
	perTryFactor = 3
	perTryFloor  = 100 * time.Millisecond
	// perTryDecay is the time constant over which a peak fades.
	perTryDecay = 10 * time.Second
	// perTryWarm is the answers an instance must give before its peak
	// applies: one answer says little.
	perTryWarm = 10
)

// epoch is the origin of the monotonic clock latencyPeak reads.
var epoch = time.Now()

// latencyPeak is a decaying peak of one instance's answered latencies: a
// slower answer replaces it, and it fades towards zero meanwhile.
type latencyPeak struct {
	peak    atomic.Int64 // nanoseconds
	stamp   atomic.Int64 // when peak was set: nanoseconds since epoch
	answers atomic.Int64 // answers seen, up to perTryWarm
}

// at returns the peak as it reads at now (nanoseconds since epoch).
func (p *latencyPeak) at(now int64) float64 {
	v := float64(p.peak.Load())
	if td := now - p.stamp.Load(); td > 0 && v > 0 {
		v *= math.Exp(-float64(td) / float64(perTryDecay))
	}
	return v
}

// observe folds in an answer that took latency, received at now.
func (p *latencyPeak) observe(latency time.Duration, now int64) {
	if p.answers.Load() < perTryWarm {
		p.answers.Add(1)
	}
	// Two racing writers may leave either answer's peak: both are recent.
	if float64(latency) > p.at(now) {
		p.peak.Store(int64(latency))
		p.stamp.Store(now)
	}
}

// timeout returns the adaptive per-try timeout at now, and false while the
// instance has not answered perTryWarm times.
func (p *latencyPeak) timeout(now int64) (time.Duration, bool) {
	if p.answers.Load() < perTryWarm {
		return 0, false
	}
	return max(perTryFloor, time.Duration(perTryFactor*p.at(now))), true
}

// adaptivePerTry returns the adaptive per-try timeout of call's attempt on
// addr at now, and false when none applies. It applies to an idempotent
// attempt that a retry may follow, when RetryPolicy.PerTryTimeout is zero
// and the service lists an instance at another address. The last attempt,
// and a hedged call's (which has its backup), may use all that remains.
func (c *Client) adaptivePerTry(call *Call, addr string, now time.Time) (time.Duration, bool) {
	if !call.Idempotent || c.opts.retry.PerTryTimeout != 0 || call.Attempt == 0 || call.Attempt >= c.opts.retry.MaxAttempts {
		return 0, false
	}
	if call.st != nil && !call.st.listsOther(addr) {
		// The retry would go to the same instance: the cut would only
		// start the same work there again, and when the instance is
		// slow because of load, add to it.
		return 0, false
	}
	h := (*c.breakers.m.Load())[addr]
	if h == nil {
		return 0, false
	}
	t, ok := h.latency.timeout(int64(now.Sub(epoch)))
	if !ok {
		return 0, false
	}
	// At most half of what the call has left, so the retry it makes room
	// for has as long: one slow answer on a loaded machine can lift the
	// peak for seconds, and a frozen instance would then take most of the
	// budget.
	return min(t, call.Deadline.Sub(now)/2), true
}

// listsOther reports whether the service lists an instance at an address
// other than addr.
func (st *serviceState) listsOther(addr string) bool {
	p := st.ins.Load()
	if p == nil {
		return false
	}
	for i := range *p {
		if (*p)[i].Addr != addr {
			return true
		}
	}
	return false
}
