// One attempt on the wire: encode the request, exchange it, decode the reply.

package proxy

import (
	"context"
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
	budget, err := c.attemptBudget(call, addr, start, start)
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
			if budget, err = c.attemptBudget(call, addr, start, time.Now()); err != nil {
				return nil, err
			}
		}
	}
	m := &out.msg
	*m = protocol.Message{
		Service:     call.Service,
		Method:      call.Method,
		Timeout:     budget,
		Attachments: call.Attachments,
		Payload:     payload,
	}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, call.codec.ID()), 0, 0)
	resp, err := c.pool.RoundTrip(ctx, addr, m)
	*m = protocol.Message{}
	return resp, err
}

// slowMarshal is the encoded size from which exchange reads the clock again
// after marshaling, to send only what is left of the budget.
const slowMarshal = 64 << 10

// attemptBudget is what an attempt on addr that began at start has left at
// now. That is the call's deadline, or the per-try timeout of an
// idempotent call if that ends first: the fixed one, or the adaptive one.
// Less than a millisecond is an error: not sent.
func (c *Client) attemptBudget(call *Call, addr string, start, now time.Time) (time.Duration, error) {
	budget := call.Deadline.Sub(now)
	if pt := c.opts.retry.PerTryTimeout; pt > 0 && call.Idempotent {
		budget = min(budget, pt-now.Sub(start))
	} else if pt, ok := c.adaptivePerTry(call, addr, start); ok {
		budget = min(budget, pt-now.Sub(start))
	}
	if budget < time.Millisecond {
		return 0, protocol.NotSent(protocol.StatusClientTimeout, "budget spent before sending "+call.Service+"."+call.Method, nil)
	}
	return budget, nil
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
