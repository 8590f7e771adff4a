// One attempt on the wire: encode the request, exchange it, decode the reply.

package proxy

import (
	"context"
	"errors"
	"time"

	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/protocol"
)

// outgoing holds a pooled request message and its payload buffer.
type outgoing struct {
	msg     protocol.Message
	payload []byte
}

// send makes one attempt on the wire. It encodes the request, sends it to
// call.Addr with what remains of the budget, and decodes the reply.
func (c *Client) send(ctx context.Context, call *Call, start time.Time) error {
	resp, err := c.exchange(ctx, call, call.Addr, start)
	if err != nil {
		return err
	}
	return c.decode(call, resp)
}

// exchange encodes the request and sends it to addr with what remains of
// the budget. It returns the OK response, which the caller must decode or
// release.
func (c *Client) exchange(ctx context.Context, call *Call, addr string, start time.Time) (*protocol.Message, error) {
	budget, perTry, err := c.attemptBudget(call, addr, start, start, len(call.payload) >= slowMarshal)
	if err != nil {
		return nil, err
	}
	out := c.reqs.Get().(*outgoing)
	defer func() {
		if cap(out.payload) > bufpool.MaxKept {
			// Written by now (or never to be): hand a large buffer back
			// to the shared pool instead of pinning it to a pooled request.
			bufpool.Put(out.payload)
			out.payload = nil
		}
		c.reqs.Put(out)
	}()
	payload := call.payload
	if payload == nil {
		if payload, err = call.codec.Marshal(out.payload[:0], call.Req); err != nil {
			return nil, encodeError(call, err)
		}
		out.payload = payload
		if len(payload) >= slowMarshal {
			// Encoding this much takes a measurable part of the budget:
			// what travels is what is left after it.
			if budget, perTry, err = c.attemptBudget(call, addr, start, time.Now(), true); err != nil {
				return nil, err
			}
		}
	}
	m := &out.msg
	*m = protocol.Message{
		Service:        call.Service,
		Method:         call.Method,
		Timeout:        budget,
		IdempotencyKey: call.key,
		Attachments:    call.Attachments,
		Payload:        payload,
	}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, call.codec.ID()), 0, 0)
	resp, err := c.pool.RoundTrip(ctx, addr, m)
	*m = protocol.Message{}
	if err != nil && perTry && errors.Is(err, ErrNotSent) && protocol.StatusOf(err) == protocol.StatusClientTimeout {
		// The per-try timeout ran out before the request left (waiting
		// for a connection or for the large requests' turn): the call's
		// budget is not spent, and another instance may take it.
		return nil, protocol.NotSent(protocol.StatusClientTimeout, "per-try timeout before sending to "+addr, errPerTryTimeout)
	}
	return resp, err
}

// errPerTryTimeout is the cause of an attempt that its per-try timeout
// ended before it was sent. Unlike a spent budget, it may be retried.
var errPerTryTimeout = errors.New("proxy: per-try timeout")

// slowMarshal is the encoded size from which exchange reads the clock again
// after marshaling, to send only what is left of the budget.
const slowMarshal = 64 << 10

// attemptBudget is what an attempt on addr that began at start has left at
// now. That is the call's deadline, or the per-try timeout of an
// idempotent call if that ends first: the fixed one, or the adaptive one.
// perTry reports that the per-try timeout set it. The adaptive one does
// not apply to a large request (64 KiB or more): its time is its
// transfer, which the latencies the peak learned from say nothing of.
// Less than a millisecond is an error: not sent.
func (c *Client) attemptBudget(call *Call, addr string, start, now time.Time, large bool) (budget time.Duration, perTry bool, err error) {
	budget = call.Deadline.Sub(now)
	pt, ok := c.opts.retry.PerTryTimeout, c.opts.retry.PerTryTimeout > 0 && call.Idempotent
	if !ok && !large {
		pt, ok = c.adaptivePerTry(call, addr, start)
	}
	if left := pt - now.Sub(start); ok && left < budget {
		budget, perTry = left, true
	}
	if budget < time.Millisecond {
		return 0, false, protocol.NotSent(protocol.StatusClientTimeout, "budget spent before sending "+call.Service+"."+call.Method, nil)
	}
	return budget, perTry, nil
}

// decode decodes an OK response into call.Resp and releases it.
func (c *Client) decode(call *Call, resp *protocol.Message) error {
	err := call.codec.Unmarshal(resp.Payload, call.Resp)
	c.pool.Release(resp)
	if err != nil {
		return &protocol.Error{Status: protocol.StatusBadResponse,
			Msg: "decode " + call.Service + "." + call.Method + " reply", Err: err}
	}
	return nil
}
