package proxy

import (
	"context"
	"fmt"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// hedgeResult is the outcome of one attempt of a hedged call.
type hedgeResult struct {
	resp *protocol.Message
	err  error
	addr string
}

// hedged makes an idempotent call with a backup attempt: the first goes to
// the balancer's pick; if it has not answered after call.Hedge (or failed
// already), a second goes to another instance. The first success wins and
// the other attempt is cancelled, which sends the cancel event to its
// server. Only the winner's reply is decoded into call.Resp.
func (c *Client) hedged(ctx context.Context, call *Call, st *serviceState) error {
	results := make(chan hedgeResult, 2)
	ctx, cancel := context.WithCancel(ctx) // ends the loser
	defer cancel()
	launch := func(in registry.Instance, done balancer.Done) {
		go func() {
			var resp *protocol.Message
			err := c.guarded(call, in.Addr, done, func(start time.Time) error {
				var err error
				resp, err = c.exchange(ctx, call, in.Addr, start)
				return err
			})
			results <- hedgeResult{resp, err, in.Addr}
		}()
	}
	first, done, err := st.bal.Pick(ctx, call.HashKey)
	if err != nil {
		return &protocol.Error{Status: protocol.StatusChannelInactive, Msg: "no instance of " + call.Service,
			Err: fmt.Errorf("%w: %w", transport.ErrNotSent, err)}
	}
	call.Attempt = 1
	launch(first, done)
	outstanding, hedgedYet := 1, false
	hedge := func() {
		hedgedYet = true
		in, done, err := st.bal.PickExcept(ctx, call.HashKey, []string{first.Addr})
		if err != nil || time.Until(call.Deadline) < time.Millisecond {
			return // nowhere else to go: wait for the first
		}
		if c.opts.observer != nil {
			c.opts.observer.Retried(call.Service, call.Method, protocol.StatusServerTimeout)
		}
		call.Attempt = 2
		outstanding++
		launch(in, done)
	}
	timer := time.NewTimer(call.Hedge)
	defer timer.Stop()
	var lastErr error
	for outstanding > 0 {
		select {
		case r := <-results:
			outstanding--
			if r.err == nil {
				cancel()
				call.Addr = r.addr
				if outstanding > 0 { // the loser's reply, if any, goes back to the pool
					go func() {
						if l := <-results; l.resp != nil {
							c.pool.Release(l.resp)
						}
					}()
				}
				return c.decode(call, r.resp)
			}
			lastErr = r.err
			call.Addr = r.addr
			if !hedgedYet && classify(r.err) != fatal {
				hedge() // the first failed early: try the backup now
			}
		case <-timer.C:
			if !hedgedYet {
				hedge()
			}
		}
	}
	return lastErr
}
