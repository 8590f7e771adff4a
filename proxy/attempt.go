// The attempts of a call: the policy plain and hedged calls share, and the plain loop.

package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// maxTried bounds the addresses a call remembers to avoid on retries.
const maxTried = 8

// attempts owns the attempts of one call, plain or hedged. It records
// each attempt's outcome and address. It decides whether another attempt
// may follow, and draws on the retry budget for it. It picks the error
// the call returns.
type attempts struct {
	c    *Client
	call *Call
	n    int // attempts started
	// ntried counts the addresses in call.tried, at most maxTried.
	ntried int
	// err is the call's outcome so far, from attempt num on addr.
	err  error
	addr string
	num  int
	sent bool // err's attempt may have reached a server
	// withdrawn is the budget drawn for the next attempt (0: none).
	withdrawn int64
}

// start records that an attempt goes out to addr and returns its number,
// from 1.
func (a *attempts) start(addr string) int {
	a.n++
	a.withdrawn = 0 // the retry it drew for goes out
	if a.ntried < maxTried {
		a.call.tried[a.ntried] = addr
		a.ntried++
	}
	return a.n
}

// tried returns the addresses of the attempts started, at most maxTried.
func (a *attempts) tried() []string { return a.call.tried[:a.ntried] }

// record notes the outcome of attempt num, made on addr; err is nil for a
// success.
func (a *attempts) record(addr string, num int, err error) {
	sent := err == nil || !errors.Is(err, ErrNotSent)
	if a.sent && !sent {
		// A sent attempt outranks an unsent one: once an attempt may
		// have reached a server, the call must not say ErrNotSent.
		return
	}
	if a.err != nil && addr == a.addr && errors.Is(err, transport.ErrDialBackoff) {
		// The refusal only repeats the failure of the dial already
		// recorded for addr (a handshake's cause, say): keep that one.
		return
	}
	a.err, a.addr, a.num, a.sent = err, addr, num, sent
}

// retry decides whether another attempt may follow the latest one, and
// draws on the retry budget when it may. err is the latest attempt's
// failure; nil means it has not answered yet (a hedge).
func (a *attempts) retry(ctx context.Context, err error) bool {
	call := a.call
	if a.n >= a.c.opts.retry.MaxAttempts || time.Until(call.Deadline) < time.Millisecond {
		return false
	}
	// A failure's class decides. A hedge, made while the first attempt
	// has not answered, needs only room and budget: FailFast does not
	// stop it.
	if err != nil {
		if call.FailFast || ctx.Err() != nil {
			return false
		}
		switch classify(err) {
		case notActed:
		case unknown:
			if !call.Idempotent {
				return false
			}
		default:
			return false
		}
	}
	token, ok := a.c.budget.withdraw(time.Now().Unix())
	if ok {
		a.withdrawn = token
	}
	return ok
}

// abandon refunds the budget drawn for an attempt that will not go out.
// Retries that never happen must not use up the budget of those that can.
func (a *attempts) abandon() {
	if a.withdrawn != 0 {
		a.c.budget.refund(a.withdrawn)
		a.withdrawn = 0
	}
}

// result returns the call's outcome: nil after a success, else the error
// that outranks the others. It names that attempt in call.Addr and
// call.Attempt. It refunds a retry that never went out.
func (a *attempts) result() error {
	a.abandon()
	a.call.Addr, a.call.Attempt = a.addr, a.num
	return a.err
}

// run is the last stage of the middleware chain. It makes the call's
// attempts, each on an instance the balancer picks. It retries as the
// RetryPolicy allows, within the call's one budget.
func (c *Client) run(ctx context.Context, call *Call) error {
	st, err := c.service(ctx, call.balanced(), call.Deadline)
	if err != nil {
		status := protocol.StatusChannelInactive
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			status = protocol.StatusClientTimeout // the budget ran out waiting for the registry
		case errors.Is(err, context.Canceled):
			status = protocol.StatusClientError // the caller gave up: ErrCanceled
		case errors.Is(err, registry.ErrInvalid):
			// A bad service name, or one the registry refuses: a bad
			// request, not an outage.
			status = protocol.StatusClientError
		}
		return protocol.NotSent(status, "resolve "+call.balanced(), err)
	}
	call.st = st
	c.budget.call(call.start.Unix())
	if !call.Idempotent && c.opts.idempotencyKeys {
		if _, ok := call.Attachments[protocol.AttachIdempotencyKey]; !ok {
			// Beside the map, not in it: the message's own field travels
			// without a map write, a map lookup and a clear per call.
			call.key = c.newKey()
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
	a := attempts{c: c, call: call}
	var last error // the failure of the previous attempt
	for {
		var in registry.Instance
		var done balancer.Done
		var perr error
		if a.n == 0 {
			in, done, perr = st.bal.Pick(ctx, call.HashKey)
		} else {
			in, done, perr = st.bal.PickExcept(ctx, call.HashKey, a.tried())
			if perr != nil && errors.Is(perr, balancer.ErrNoInstance) {
				in, done, perr = st.bal.Pick(ctx, call.HashKey) // all tried: any usable one again
			}
		}
		if perr != nil {
			if a.n > 0 {
				// The error of an attempt says more than "no
				// instance": the call returns it, saying first why
				// it went no further.
				return c.noneLeft(ctx, call, a.result(), a.n+1, nil)
			}
			return c.noInstance(ctx, call.balanced(), perr)
		}
		call.Addr = in.Addr
		call.Attempt = a.start(in.Addr)
		if call.OnAttempt != nil {
			call.OnAttempt(AttemptInfo{Attempt: call.Attempt, Addr: in.Addr, After: last})
		}
		err := c.attempt(ctx, call, done)
		last = err
		a.record(call.Addr, call.Attempt, err)
		if err == nil || !a.retry(ctx, err) {
			return a.result()
		}
		if pause := c.opts.retry.backoff(call.Attempt); pause > 0 {
			if time.Until(call.Deadline) <= pause+time.Millisecond {
				return a.result()
			}
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return a.result()
			}
		}
		if c.opts.observer != nil {
			c.opts.observer.Retried(call.Service, call.Method, protocol.StatusOf(err))
		}
	}
}

// attempt sends one attempt to call.Addr through its breaker and reports
// the outcome to the balancer.
func (c *Client) attempt(ctx context.Context, call *Call, done balancer.Done) error {
	return c.guarded(call, call.Addr, done, func(start time.Time) error { return c.send(ctx, call, start) })
}

// errUnlisted is the cause of an attempt on an address that left its
// service's list between the pick and the attempt. It was not sent, and
// another instance may take it.
var errUnlisted = errors.New("proxy: the address left the instance list")

// guarded runs one attempt to addr under addr's circuit breaker. It then
// reports the outcome to the balancer (done) and the observer. An attempt
// the breaker refuses fails as not sent.
func (c *Client) guarded(call *Call, addr string, done balancer.Done, run func(start time.Time) error) error {
	start := time.Now()
	var err error
	// A failure from an address that announced its shutdown says nothing
	// of the next process there, a restart on the same port. It counts
	// neither for its breaker nor for the balancer's figures.
	draining := false
	h, fresh := c.breakers.lookup(addr)
	if fresh && !c.lists(call.balanced(), addr) {
		// Picked from a list that an update replaced meanwhile, after
		// the address's health went with it: the address is gone, and a
		// fresh health would know no latency to bound the attempt by.
		c.breakers.dropIf(addr, h)
		done(0, nil)
		return protocol.NotSent(protocol.StatusChannelInactive, addr, errUnlisted)
	}
	switch {
	case c.breakers.cfg.Disabled:
		err = run(start)
		draining = err != nil && c.pool.ReadOnly(addr)
	case c.breakers.quiet(h):
		err = run(start)
		if draining = err != nil && c.pool.ReadOnly(addr); !draining && countsAgainst(err) {
			h.fail(err)
		}
	default:
		ran := false
		berr := errNoHeartbeat
		// A call probes a tripped breaker only once its instance answered
		// the heartbeat: none waits on an instance that answers nothing.
		if !h.tripped.Load() || h.admit.Load() {
			_, berr = h.cb.Execute(func() (struct{}, error) {
				ran = true
				err = run(start)
				if draining = err != nil && c.pool.ReadOnly(addr); draining {
					return struct{}{}, errDraining
				}
				return struct{}{}, err
			})
		}
		switch {
		case ran:
			if draining {
				h.settle(errDraining)
			} else {
				h.settle(err)
			}
		case c.panicking((*c.services.Load())[call.balanced()]):
			// Every instance is left out, or most: each call probes one
			// at once, past its breaker. The first success closes it.
			if err = run(start); err == nil {
				c.breakers.reset(addr, h)
			}
			draining = err != nil && c.pool.ReadOnly(addr)
		default:
			err = protocol.NotSent(protocol.StatusChannelInactive, addr, fmt.Errorf("%w: %w", errBreakerOpen, berr))
		}
	}
	latency := time.Since(start)
	if pe := asError(err); err == nil || pe != nil && pe.Remote {
		// An answer, whatever it says, tells how long the instance takes.
		h.latency.observe(latency, int64(start.Sub(epoch)+latency))
	}
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
