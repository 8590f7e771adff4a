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
	// retry has budget left. Default 0: an attempt may use all that remains.
	PerTryTimeout time.Duration
	// BackoffBase and BackoffMax bound the jittered exponential pause
	// before a retry. Defaults 2 ms and 50 ms.
	BackoffBase, BackoffMax time.Duration
	// BudgetRatio is the share of calls that may be retried, over a
	// sliding ten-second window. Default 0.1: one retry per ten calls.
	BudgetRatio float64
	// BudgetFloor is the retries per second allowed beyond BudgetRatio,
	// so that a quiet client can still retry. Default 10; negative means 0.
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

// retryBudget allows retries up to a ratio of the calls seen over a sliding
// window, plus a floor per second. When a whole service is down, retries
// stop multiplying the load. It takes no lock: a call costs one atomic add.
type retryBudget struct {
	ratio   float64
	floor   int64
	buckets [budgetBuckets]budgetBucket
}

const budgetBuckets = 10 // one per second

type budgetBucket struct {
	sec     atomic.Int64 // the unix second the counts belong to
	calls   atomic.Int64
	retries atomic.Int64
}

func newRetryBudget(ratio float64, floorPerSec int) *retryBudget {
	return &retryBudget{ratio: ratio, floor: int64(floorPerSec) * budgetBuckets}
}

// bucket returns the bucket of the current second, resetting it when it
// last held an older second.
func (b *retryBudget) bucket(now int64) *budgetBucket {
	k := &b.buckets[now%budgetBuckets]
	if old := k.sec.Load(); old != now && k.sec.CompareAndSwap(old, now) {
		k.calls.Store(0)
		k.retries.Store(0)
	}
	return k
}

// call records a call made at now (Unix seconds).
func (b *retryBudget) call(now int64) { b.bucket(now).calls.Add(1) }

// withdraw reports whether a retry is allowed now, and counts it if so.
// sec identifies the withdrawal for refund.
func (b *retryBudget) withdraw() (sec int64, ok bool) {
	now := time.Now().Unix()
	mine := b.bucket(now)
	// Counted first, taken back when over the limit: concurrent
	// withdrawals see each other and never overshoot together.
	mine.retries.Add(1)
	var calls, retries int64
	for i := range b.buckets {
		k := &b.buckets[i]
		if now-k.sec.Load() < budgetBuckets {
			calls += k.calls.Load()
			retries += k.retries.Load()
		}
	}
	if float64(retries) > float64(calls)*b.ratio+float64(b.floor) {
		mine.retries.Add(-1)
		return 0, false
	}
	return now, true
}

// refund takes back a withdrawal made at sec whose retry never went out.
// No instance could take it, or no time was left after the backoff.
// A withdrawal whose second has left the window is gone already.
func (b *retryBudget) refund(sec int64) {
	k := &b.buckets[sec%budgetBuckets]
	if k.sec.Load() == sec {
		k.retries.Add(-1)
	}
}
