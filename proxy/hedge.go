package proxy

import (
	"context"
	"errors"
	"maps"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
)

// hedgeResult is the outcome of one attempt of a hedged call.
type hedgeResult struct {
	resp    *protocol.Message
	err     error
	addr    string
	attempt int
}

// answered reports an attempt's failure that is the server's final word:
// a status it sent that no retry may change (the method ran and failed, it
// has no such method, ...). Like a success it ends a hedged call at once.
func answered(err error) bool {
	pe := asError(err)
	return pe != nil && pe.Remote && classify(err) == fatal
}

// hedged makes an idempotent call with a backup attempt: the first goes to
// the balancer's pick; if it has not answered after call.Hedge (or failed
// already, in a way that may be retried), a second goes to another
// instance. The backup counts as a retry: it needs MaxAttempts of 2 or
// more and draws on the retry budget. The first success wins, as does the
// first answer from a server that no retry may change (a 70, say), and
// the other attempt is cancelled, which sends the cancel event to its server. Only
// the winner's reply is decoded into call.Resp.
//
// The request is marshaled once, here, and both attempts read only a
// private copy of the call: the loser may still be on its way (waiting for
// a connection, writing) after hedged returns, when Invoke has recycled
// call and the caller owns its request and attachments again.
func (c *Client) hedged(ctx context.Context, call *Call, st *serviceState) error {
	payload, err := call.codec.Marshal(nil, call.Req)
	if err != nil {
		return encodeError(call, err)
	}
	shared := &Call{Service: call.Service, Method: call.Method, Idempotent: true, Deadline: call.Deadline,
		Attachments: maps.Clone(call.Attachments), codec: call.codec, payload: payload}
	results := make(chan hedgeResult, 2)
	ctx, cancel := context.WithCancel(ctx) // ends the loser
	defer cancel()
	launch := func(in registry.Instance, done balancer.Done, attempt int) {
		go func() {
			var resp *protocol.Message
			err := c.guarded(shared, in.Addr, done, func(start time.Time) error {
				var err error
				resp, err = c.exchange(ctx, shared, in.Addr, start)
				return err
			})
			results <- hedgeResult{resp, err, in.Addr, attempt}
		}()
	}
	first, done, err := st.bal.Pick(ctx, call.HashKey)
	if err != nil {
		return c.noInstance(ctx, call.Service, err)
	}
	launch(first, done, 1)
	outstanding, hedgedYet := 1, false
	// nowhere is set when no instance could take the backup: a failure
	// the backup could have followed then says so first.
	nowhere := false
	// hedge sends the backup, after the first attempt failed with failed,
	// or (nil) when it has not answered in time.
	hedge := func(failed error) {
		hedgedYet = true
		status := protocol.StatusServerTimeout
		var sec int64
		if failed != nil {
			var ok bool
			if ok, sec = c.retryable(ctx, call, failed, 1, &c.opts.retry); !ok {
				return
			}
			status = protocol.StatusOf(failed)
		} else {
			if c.opts.retry.MaxAttempts < 2 || time.Until(call.Deadline) < time.Millisecond {
				return
			}
			var ok bool
			if sec, ok = c.budget.withdraw(); !ok {
				return
			}
		}
		// Picked last: a pick whose attempt never starts would stay
		// counted in flight by the balancer.
		in, done, err := st.bal.PickExcept(ctx, call.HashKey, []string{first.Addr})
		if err != nil {
			c.budget.refund(sec) // the backup never goes out
			nowhere = true
			return // nowhere else to go: wait for the first
		}
		if c.opts.observer != nil {
			c.opts.observer.Retried(call.Service, call.Method, status)
		}
		outstanding++
		launch(in, done, 2)
	}
	timer := time.NewTimer(call.Hedge)
	defer timer.Stop()
	var lastErr error
	for outstanding > 0 {
		select {
		case r := <-results:
			outstanding--
			if r.err == nil || answered(r.err) {
				cancel()
				call.Addr, call.Attempt = r.addr, r.attempt
				if outstanding > 0 { // the loser's reply, if any, goes back to the pool
					go func() {
						if l := <-results; l.resp != nil {
							c.pool.Release(l.resp)
						}
					}()
				}
				if r.err != nil {
					return r.err
				}
				return c.decode(call, r.resp)
			}
			// An attempt that may have reached a server outranks a
			// later one that failed unsent: the call must not say
			// ErrNotSent once one of its attempts was sent.
			if !errors.Is(r.err, ErrNotSent) || lastErr == nil || errors.Is(lastErr, ErrNotSent) {
				lastErr = r.err
				call.Addr, call.Attempt = r.addr, r.attempt
			}
			if !hedgedYet {
				hedge(r.err) // the first failed early: try the backup now, if that failure may be retried
			}
		case <-timer.C:
			if !hedgedYet {
				hedge(nil)
			}
		}
	}
	if nowhere && classify(lastErr) != fatal { // a failure a backup could have followed
		return c.noneLeft(ctx, call, lastErr, 2, []string{first.Addr})
	}
	return lastErr
}
