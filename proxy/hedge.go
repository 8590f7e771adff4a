// Hedged calls: a backup attempt when the first is slow.

package proxy

import (
	"context"
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

// answered reports an attempt's failure that is the server's final word: a
// status it sent that no retry may change, such as a 70 or a 60. Like a
// success, it ends a hedged call at once.
func answered(err error) bool {
	pe := asError(err)
	return pe != nil && pe.Remote && classify(err) == fatal
}

// hedged makes an idempotent call with a backup attempt. The first goes to
// the balancer's pick. A second goes to another instance if the first has
// not answered after call.Hedge, or failed already in a way that may be
// retried. The backup counts as a retry: it needs MaxAttempts of 2 or more
// and draws on the retry budget. The first success wins, as does the first
// answer no retry may change (a 70, say). The other attempt is cancelled,
// which sends the cancel event to its server. Only the winner's reply is
// decoded into call.Resp.
func (c *Client) hedged(ctx context.Context, call *Call, st *serviceState) error {
	// Marshaled once, here; both attempts read only a private copy of the
	// call. The loser may still be on its way (dialing, writing) after
	// hedged returns, when Invoke has recycled call and the caller owns
	// its request and attachments again.
	payload := call.payload
	if payload == nil {
		var err error
		if payload, err = call.codec.Marshal(nil, call.Req); err != nil {
			return encodeError(call, err)
		}
	}
	shared := &Call{Service: call.Service, Method: call.Method, Idempotent: true, Deadline: call.Deadline,
		Attachments: maps.Clone(call.Attachments), key: call.key, codec: call.codec, payload: payload, route: call.route}
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
	a := attempts{c: c, call: call}
	first, done, err := st.bal.Pick(ctx, call.HashKey)
	if err != nil {
		return c.noInstance(ctx, call.balanced(), err)
	}
	n := a.start(first.Addr)
	if call.OnAttempt != nil {
		call.OnAttempt(AttemptInfo{Attempt: n, Addr: first.Addr})
	}
	launch(first, done, n)
	outstanding := 1
	// decided is set once the first attempt had its one decision: the
	// backup goes, or it does not.
	decided := false
	// nowhere is set when no instance could take the backup: a failure
	// the backup could have followed then says so first.
	nowhere := false
	// hedge sends the backup, after the first attempt failed with failed,
	// or (nil) when it has not answered in time.
	hedge := func(failed error) {
		decided = true
		if !a.retry(ctx, failed) {
			return
		}
		// Picked last: a pick whose attempt never starts would stay
		// counted in flight by the balancer.
		in, done, err := st.bal.PickExcept(ctx, call.HashKey, a.tried())
		if err != nil {
			a.abandon()
			nowhere = true
			return // nowhere else to go: wait for the first
		}
		if c.opts.observer != nil {
			status := protocol.StatusServerTimeout
			if failed != nil {
				status = protocol.StatusOf(failed)
			}
			c.opts.observer.Retried(call.Service, call.Method, status)
		}
		outstanding++
		n := a.start(in.Addr)
		if call.OnAttempt != nil {
			call.OnAttempt(AttemptInfo{Attempt: n, Addr: in.Addr, Hedge: true, After: failed})
		}
		launch(in, done, n)
	}
	timer := time.NewTimer(call.Hedge)
	defer timer.Stop()
	for outstanding > 0 {
		select {
		case r := <-results:
			outstanding--
			a.record(r.addr, r.attempt, r.err)
			if r.err == nil || answered(r.err) {
				cancel()
				if outstanding > 0 { // the loser's reply, if any, goes back to the pool
					go func() {
						if l := <-results; l.resp != nil {
							c.pool.Release(l.resp)
						}
					}()
				}
				if err := a.result(); err != nil {
					return err
				}
				return c.decode(call, r.resp)
			}
			if !decided {
				hedge(r.err) // the first failed early: try the backup now, if that failure may be retried
			}
		case <-timer.C:
			if !decided {
				hedge(nil)
			}
		}
	}
	err = a.result()
	if nowhere && classify(err) != fatal { // a failure a backup could have followed
		return c.noneLeft(ctx, call, err, 2, a.tried())
	}
	return err
}
