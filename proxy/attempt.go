// The attempt loop: each attempt of a call, its breaker, and whether to retry.

package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
)

// run is the last stage of the middleware chain: it makes the call's
// attempts, each on an instance the balancer picks, retrying as the
// RetryPolicy allows within the call's one budget.
func (c *Client) run(ctx context.Context, call *Call) error {
	st, err := c.service(ctx, call.Service, call.Deadline)
	if err != nil {
		status := protocol.StatusChannelInactive
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			status = protocol.StatusClientTimeout // the budget ran out waiting for the registry
		case errors.Is(err, context.Canceled):
			status = protocol.StatusClientError // the caller gave up: ErrCanceled
		case errors.Is(err, registry.ErrInvalid):
			// A bad service name, an unknown balancer, a service the
			// registry refuses: a bad request, not an outage.
			status = protocol.StatusClientError
		}
		return protocol.NotSent(status, "resolve "+call.Service, err)
	}
	c.budget.call(call.start.Unix())
	if !call.Idempotent && c.opts.idempotencyKeys {
		if _, ok := call.Attachments[protocol.AttachIdempotencyKey]; !ok {
			call.SetAttachment(protocol.AttachIdempotencyKey, c.newKey())
		}
	}
	if err := ctx.Err(); err != nil {
		// Before any pick: a call nobody waits for takes no probe of a
		// half-open breaker and no place in the balancer's figures.
		return protocol.ContextError(err, false)
	}
	if call.Hedge > 0 && call.Idempotent {
		return c.hedged(ctx, call, st)
	}
	policy := &c.opts.retry
	tried := &call.tried
	ntried := 0
	// sent is the error of the latest attempt that may have reached the
	// server: once there is one, the call's error must not say ErrNotSent
	// (a retry that failed unsent does not undo it).
	//
	// The Call names the attempt whose error is returned: final sets
	// Addr and Attempt back to sent's when it returns sent.
	var sent error
	var sentAddr string
	var sentAttempt int
	// withdrawn is the retry budget's withdrawal for the retry about to
	// be made (0: none): refunded when that retry never goes out.
	var withdrawn int64
	final := func(err error) error {
		if withdrawn != 0 {
			c.budget.refund(withdrawn)
			withdrawn = 0
		}
		if sent != nil && errors.Is(err, ErrNotSent) {
			call.Addr, call.Attempt = sentAddr, sentAttempt
			return sent
		}
		return err
	}
	for attempt := 1; ; attempt++ {
		var in registry.Instance
		var done balancer.Done
		var perr error
		if ntried == 0 {
			in, done, perr = st.bal.Pick(ctx, call.HashKey)
		} else {
			in, done, perr = st.bal.PickExcept(ctx, call.HashKey, tried[:ntried])
			if perr != nil && errors.Is(perr, balancer.ErrNoInstance) {
				in, done, perr = st.bal.Pick(ctx, call.HashKey) // all tried: any usable one again
			}
		}
		if perr != nil {
			if err != nil {
				// The error of an attempt says more than "no
				// instance": the call returns it, saying first why
				// it went no further.
				return c.noneLeft(ctx, call, final(err), attempt, nil)
			}
			return c.noInstance(ctx, call.Service, perr)
		}
		withdrawn = 0 // the retry goes out
		if ntried < maxTried {
			tried[ntried] = in.Addr
			ntried++
		}
		call.Addr = in.Addr
		call.Attempt = attempt
		err = c.attempt(ctx, call, done)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrNotSent) {
			sent, sentAddr, sentAttempt = err, call.Addr, call.Attempt
		}
		ok, sec := c.retryable(ctx, call, err, attempt, policy)
		if !ok {
			return final(err)
		}
		withdrawn = sec
		if pause := policy.backoff(attempt); pause > 0 {
			if time.Until(call.Deadline) <= pause+time.Millisecond {
				return final(err)
			}
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return final(err)
			}
		}
		if c.opts.observer != nil {
			c.opts.observer.Retried(call.Service, call.Method, protocol.StatusOf(err))
		}
	}
}

// maxTried bounds the addresses a call remembers to avoid on retries.
const maxTried = 8

// retryable decides whether a failed attempt is tried again; when it is,
// sec is the retry budget's withdrawal, to be refunded if the retry never
// goes out.
func (c *Client) retryable(ctx context.Context, call *Call, err error, attempt int, p *RetryPolicy) (ok bool, sec int64) {
	if call.FailFast || attempt >= p.MaxAttempts || ctx.Err() != nil || time.Until(call.Deadline) < time.Millisecond {
		return false, 0
	}
	switch classify(err) {
	case notActed:
	case unknown:
		if !call.Idempotent {
			return false, 0
		}
	default:
		return false, 0
	}
	sec, ok = c.budget.withdraw()
	return ok, sec
}

// attempt sends one attempt to call.Addr through its breaker and reports
// the outcome to the balancer.
func (c *Client) attempt(ctx context.Context, call *Call, done balancer.Done) error {
	return c.guarded(call, call.Addr, done, func(start time.Time) error { return c.send(ctx, call, start) })
}

// guarded runs one attempt to addr under addr's circuit breaker, then
// reports its outcome to the balancer (done) and the observer. A breaker
// that refuses the attempt makes it fail as not sent.
func (c *Client) guarded(call *Call, addr string, done balancer.Done, run func(start time.Time) error) error {
	start := time.Now()
	var err error
	// A failure from an address that announced its shutdown says nothing
	// of the next process there (a restart on the same port): it counts
	// neither for its breaker nor for the balancer's figures.
	draining := false
	if c.breakers.cfg.Disabled {
		err = run(start)
		draining = err != nil && c.pool.ReadOnly(addr)
	} else {
		ran := false
		_, berr := c.breakers.get(addr).cb.Execute(func() (struct{}, error) {
			ran = true
			err = run(start)
			if draining = err != nil && c.pool.ReadOnly(addr); draining {
				return struct{}{}, errDraining
			}
			return struct{}{}, err
		})
		if !ran {
			err = protocol.NotSent(protocol.StatusChannelInactive, addr, fmt.Errorf("%w: %w", errBreakerOpen, berr))
		}
	}
	latency := time.Since(start)
	if instanceFailure(err) && !errors.Is(err, errBreakerOpen) && !draining {
		done(latency, err)
	} else {
		done(latency, nil)
	}
	if c.opts.observer != nil {
		c.opts.observer.Attempted(call.Service, call.Method, addr, protocol.StatusOf(err), latency)
	}
	return err
}
