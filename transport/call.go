// One round trip over a client connection: the pooled call, its write, its wait and giving up.

package transport

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// call is one two-way request waiting for its response. Calls are pooled,
// each with its channel and timer, so a round trip allocates neither.
type call struct {
	// ch receives exactly one value per use: the response, or nil when
	// the connection broke. Capacity 1, so the sender never blocks.
	ch    chan *protocol.Message
	timer *time.Timer // the budget timer; stopped when not in use
	// err, set before a nil is sent on ch, is this call's own failure
	// (its response could not be read); nil means the connection broke.
	err error
}

var callPool = sync.Pool{New: func() any {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &call{ch: make(chan *protocol.Message, 1), timer: t}
}}

// roundTrip sends req on c and waits. start is when RoundTrip was entered
// (zero when req.Timeout <= 0).
func (c *clientConn) roundTrip(ctx context.Context, req *protocol.Message, start time.Time) (*protocol.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, protocol.ContextError(err, false)
	}
	var remaining time.Duration
	if req.Timeout > 0 {
		remaining = req.Timeout
		if !start.IsZero() {
			remaining -= time.Since(start)
		}
		if remaining <= 0 {
			return nil, protocol.NotSent(protocol.StatusClientTimeout, "timeout budget spent before sending", nil)
		}
	}
	id := c.nextID.Add(1)
	req.Header.SetID(id)

	if !req.Header.Flags().IsTwoWay() {
		switch c.load() {
		case connReadOnly:
			return nil, c.errReadOnly()
		case connGoneAway:
			return nil, c.errGoneAway() // the server would drop it unrun
		}
		queued, err := c.write(ctx, req, remaining)
		if err != nil {
			return nil, c.writeError(queued, err)
		}
		return nil, nil
	}

	cl := callPool.Get().(*call)
	gen, err := c.register(id, cl, true)
	if err != nil {
		callPool.Put(cl)
		return nil, err
	}
	var deadline time.Time
	if gen != 0 && remaining > 0 {
		deadline = time.Now().Add(remaining)
	}
	queued, err := c.write(ctx, req, remaining)
	if err != nil {
		// A frame cut off by the caller's time is still finished, so the
		// server will run it: tell it the caller has gone.
		gaveUp := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
		c.abandon(id, cl, queued && gaveUp)
		if gen != 0 {
			c.release()
		}
		callPool.Put(cl)
		return nil, c.writeError(queued, err)
	}
	if gen != 0 {
		// Alone on the connection: read the answer here.
		if m, done, err := c.readOwn(ctx, id, cl, gen, deadline); done {
			return m, err
		}
		if remaining > 0 {
			if remaining = time.Until(deadline); remaining <= 0 {
				remaining = time.Nanosecond
			}
		}
	}

	var timeout <-chan time.Time
	if remaining > 0 {
		cl.timer.Reset(remaining)
		timeout = cl.timer.C
	}
	select {
	case m := <-cl.ch:
		if timeout != nil {
			cl.timer.Stop()
		}
		if m == nil {
			if err := cl.err; err != nil {
				cl.err = nil
				callPool.Put(cl)
				return nil, err
			}
			callPool.Put(cl)
			return nil, &protocol.Error{Status: protocol.StatusChannelInactive, Msg: "connection lost", Err: c.closeErr()}
		}
		callPool.Put(cl)
		if m.Header.Status() != protocol.StatusOK {
			err := m.Err()
			putMessage(m)
			return nil, err
		}
		return m, nil
	case <-ctx.Done():
		if timeout != nil {
			cl.timer.Stop()
		}
		c.abandon(id, cl, true)
		callPool.Put(cl)
		return nil, protocol.ContextError(ctx.Err(), true)
	case <-timeout:
		c.abandon(id, cl, true)
		callPool.Put(cl)
		return nil, &protocol.Error{Status: protocol.StatusServerTimeout, Msg: "timed out waiting for the response",
			Err: context.DeadlineExceeded}
	}
}

// write writes req; with a budget, the wire carries what is left of it
// (remaining) rather than req.Timeout, which is left as the caller set it.
//
// The write ends with ctx, or when the budget does (a large frame's write
// may wait for the socket; see writeMessage), with ctx's error or
// context.DeadlineExceeded.
func (c *clientConn) write(ctx context.Context, req *protocol.Message, remaining time.Duration) (queued bool, err error) {
	lim := limit{ctx: ctx}
	if remaining <= 0 {
		return c.w.writeMessage(req, lim)
	}
	if len(req.Payload) >= largePayload {
		lim.deadline = time.Now().Add(remaining)
	}
	budget := req.Timeout
	req.Timeout = remaining
	queued, err = c.w.writeMessage(req, lim)
	req.Timeout = budget
	return queued, err
}

func (c *clientConn) writeError(queued bool, err error) error {
	if refused := c.refusedErr(); refused != nil {
		// The reader saw the server refuse the connection (a TLS 1.3
		// client certificate is checked after the client's handshake
		// ends) and closed it under this write. The server read nothing.
		return protocol.NotSent(protocol.StatusChannelInactive, "cannot connect", refused)
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) {
		if !queued { // it waited for its turn to write
			return protocol.ContextError(err, false)
		}
		// Cut off mid-frame: the rest still goes out, so the server may
		// act on it.
		if errors.Is(err, context.DeadlineExceeded) {
			return &protocol.Error{Status: protocol.StatusServerTimeout, Msg: "deadline exceeded while sending", Err: err}
		}
		return &protocol.Error{Status: protocol.StatusClientError, Msg: "call cancelled while sending", Err: err}
	}
	switch {
	case errors.Is(err, errBackedUp):
		return protocol.NotSent(protocol.StatusChannelInactive, c.ep.addr+" is not reading what was sent", err)
	case !queued:
		return protocol.NotSent(protocol.StatusChannelInactive, "connection closed before sending", err)
	}
	return &protocol.Error{Status: protocol.StatusChannelInactive, Msg: "connection lost while sending", Err: err}
}

// abandon takes a call out of the pending table when its caller stops
// waiting. If the reader or close got there first, the value they sent is
// received and dropped, so the call can be reused. With cancel (the
// request was written), a call still pending when abandoned sends the
// cancel event, so the server stops working on it.
func (c *clientConn) abandon(id uint64, cl *call, cancel bool) {
	c.mu.Lock()
	if got, ok := c.pending[id]; ok && got == cl {
		delete(c.pending, id)
		drained := c.drainedLocked()
		c.mu.Unlock()
		switch {
		case cancel:
			c.cancelRemote(id, drained)
		case drained:
			c.closeDrained()
		}
		return
	}
	c.mu.Unlock()
	if m := <-cl.ch; m != nil {
		putMessage(m)
	}
	cl.err = nil
}

// cancelRemote sends the cancel event for request id, whose caller gave
// up while the server may still be working on it. It is best effort and
// never waits on the socket. On a connection that failed it does nothing.
// With closeDrained (the last call of a draining connection), the
// connection closes after the frame was written.
func (c *clientConn) cancelRemote(id uint64, closeDrained bool) {
	flush := c.w.queueEvent(eventCancel, id)
	// The frame joined the writer's buffer. If nobody was flushing, the
	// flush runs on a goroutine of its own, counted by the pool.
	if !flush {
		if closeDrained {
			c.closeDrained()
		}
		return
	}
	finish := func() {
		// When the socket was full, the close below may overtake the
		// frame. That costs nothing: a server cancels the calls still
		// running on a connection that closes.
		_ = c.w.flush() // a failed write closes the connection itself
		if closeDrained {
			c.closeDrained()
		}
	}
	if !c.ep.p.goTracked() {
		finish() // the pool is closing; its Close closes c, ending any write
		return
	}
	go func() {
		defer c.ep.p.wg.Done()
		finish()
	}()
}
