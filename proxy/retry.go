// The retry policy: which failures may be retried, backoff, the budget.

package proxy

import (
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// RetryPolicy says when a failed attempt is tried again on another
// instance. Fields left zero take their defaults.
//
// An attempt the server provably did not act on may be retried whatever
// the method. It was never sent, rejected with 100, or refused by a server
// whose budget was spent. Any other failure leaves it unknown whether the
// server acted, such as a timeout or a connection lost after sending. Only
// idempotent methods are retried then. A rejection with code
// unauthenticated or permission_denied is never retried; any other code
// leaves the status to decide. All attempts of a call share its
// one deadline and carry the same idempotency key. See docs/resilience.md.
type RetryPolicy struct {
	// MaxAttempts bounds the attempts of one call, the first included.
	// Default 3; 1 disables retries and hedging.
	MaxAttempts int
	// PerTryTimeout bounds one attempt of an idempotent method, so that a
	// retry has budget left. Default 0: adaptive, from the instance's
	// observed latency (docs/resilience.md). Negative turns it off: an
	// attempt may use all that remains.
	PerTryTimeout time.Duration
	// BackoffBase and BackoffMax bound the jittered exponential pause
	// before a retry. Defaults 2 ms and 50 ms.
	BackoffBase, BackoffMax time.Duration
	// BudgetRatio is the share of the current second's calls that may be
	// retried. Calls of earlier seconds lend it nothing. Default 0.1: one
	// retry per ten calls.
	BudgetRatio float64
	// BudgetFloor is the retries per second allowed beyond BudgetRatio,
	// so that a quiet client can still retry. Unused, it is saved up over
	// ten seconds. Default 10; negative means 0.
	BudgetFloor int
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts <= 0 {
		p.MaxAttempts = 3
	}
	if p.BackoffBase <= 0 {
		p.BackoffBase = 2 * time.Millisecond
	}
	if p.BackoffMax <= 0 {
		p.BackoffMax = 50 * time.Millisecond
	}
	if p.BudgetRatio <= 0 {
		p.BudgetRatio = 0.1
	}
	if p.BudgetFloor < 0 {
		p.BudgetFloor = 0
	} else if p.BudgetFloor == 0 {
		p.BudgetFloor = 10
	}
	return p
}

// backoff returns the pause before retry number n (1 for the first retry):
// full jitter over an exponential bound.
func (p *RetryPolicy) backoff(n int) time.Duration {
	ceil := p.BackoffBase << min(n-1, 16)
	if ceil > p.BackoffMax || ceil <= 0 {
		ceil = p.BackoffMax
	}
	return time.Duration(rand.Int64N(int64(ceil) + 1))
}

// verdict classifies a failed attempt.
type verdict uint8

const (
	// fatal: do not retry (the server acted, or retrying cannot help).
	fatal verdict = iota
	// notActed: the server provably did not act; safe for any method.
	notActed
	// unknown: the server may have acted; safe for idempotent methods.
	unknown
)

// classify tells whether the server may have acted on an attempt that
// failed with err.
func classify(err error) verdict {
	pe := asError(err)
	if pe == nil || refused(pe) {
		// Any other code leaves the status to decide: a code never
		// makes retryable what was not.
		return fatal
	}
	if pe.Remote {
		switch pe.Status {
		case protocol.StatusServerThreadpoolExhausted, // rejected without running, or draining
			protocol.StatusServerTimeout: // budget spent before the handler ran
			return notActed
		}
		return fatal
	}
	if errors.Is(err, ErrNotSent) {
		if errors.Is(err, errPerTryTimeout) {
			return notActed // the call's budget remains: try elsewhere
		}
		switch pe.Status {
		case protocol.StatusClientTimeout, protocol.StatusClientError:
			return fatal // the budget is spent or the caller gave up: nothing to retry with
		}
		return notActed
	}
	switch pe.Status {
	case protocol.StatusServerTimeout, protocol.StatusChannelInactive:
		return unknown
	}
	return fatal
}

// retryBudget allows retries up to a ratio of the calls made in the
// current second, plus a floor per second that a window of ten seconds may
// save up. When a whole service is down, retries stop multiplying the
// load, from the outage's first second: the calls of earlier seconds lend
// the ratio nothing. It takes no lock: a call costs one atomic add.
type retryBudget struct {
	ratio   float64
	floor   int64 // retries the floor allows per window
	buckets [budgetBuckets]budgetBucket
}

const budgetBuckets = 10 // one per second: the floor's window

type budgetBucket struct {
	sec   atomic.Int64 // the unix second the counts belong to
	calls atomic.Int64
	// retries were drawn on this second's calls, floored on the floor.
	retries, floored atomic.Int64
}

func newRetryBudget(ratio float64, floorPerSec int) *retryBudget {
	return &retryBudget{ratio: ratio, floor: int64(floorPerSec) * budgetBuckets}
}

// bucket returns the bucket of second now, resetting it when it last held
// an older second.
func (b *retryBudget) bucket(now int64) *budgetBucket {
	k := &b.buckets[now%budgetBuckets]
	if old := k.sec.Load(); old != now && k.sec.CompareAndSwap(old, now) {
		k.calls.Store(0)
		k.retries.Store(0)
		k.floored.Store(0)
	}
	return k
}

// call records a call made at now (Unix seconds).
func (b *retryBudget) call(now int64) { b.bucket(now).calls.Add(1) }

// withdraw reports whether a retry is allowed at now (Unix seconds), and
// counts it if so. The token it returns identifies the withdrawal for
// refund; it is never 0.
func (b *retryBudget) withdraw(now int64) (token int64, ok bool) {
	mine := b.bucket(now)
	// Counted first, taken back when over the limit: concurrent
	// withdrawals see each other and never overshoot together.
	if r := mine.retries.Add(1); float64(r) <= float64(mine.calls.Load())*b.ratio {
		return now << 1, true
	}
	mine.retries.Add(-1)
	// The ratio of this second is spent: the floor, over the window. It
	// lets a quiet client retry, and absorbs the failures of the calls in
	// flight when an instance dies.
	mine.floored.Add(1)
	var floored int64
	for i := range b.buckets {
		k := &b.buckets[i]
		if now-k.sec.Load() < budgetBuckets {
			floored += k.floored.Load()
		}
	}
	if floored > b.floor {
		mine.floored.Add(-1)
		return 0, false
	}
	return now<<1 | 1, true
}

// refund takes back the withdrawal token whose retry never went out. No
// instance could take it, or no time was left after the backoff. A
// withdrawal whose second has left the window is gone already.
func (b *retryBudget) refund(token int64) {
	sec := token >> 1
	k := &b.buckets[sec%budgetBuckets]
	if k.sec.Load() != sec {
		return
	}
	if token&1 == 1 {
		k.floored.Add(-1)
	} else {
		k.retries.Add(-1)
	}
}
