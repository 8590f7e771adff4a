// A handler's context (handlerCtx), and Request and RequestMetadata that read it.

package transport

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// handlerCtx is a handler's context when its request is two-way or came
// with a budget. It is done when the server closes, at the deadline if
// any, and on the client's cancel event. It is cancelled with
// context.Canceled when ServeRPC returns, like net/http's request
// context, and stays so.
//
// It costs one allocation per call, where context.WithDeadline and
// context.WithValue cost several. The channel, the deadline timer and the
// watch on the base context are made only if Done or AfterFunc is called.
// Until then Err reads the clock. TestHandlerCtxAllocs guards the gain.
type handlerCtx struct {
	base     context.Context // cancelled by the server's Close
	deadline time.Time       // zero: none
	// req is the request being served (Request). It is nil once the
	// handler returned: the message goes back to a pool then.
	req atomic.Pointer[protocol.Message]
	// What the context keeps of its request for good (RequestMetadata).
	// The decoded attachment map is the request's own, never reused.
	attachments    map[string]string
	idempotencyKey string
	// peer is the connection's, shared by its calls (RemotePeer).
	peer *Peer

	mu       sync.Mutex // guards the fields below
	done     chan struct{}
	err      error
	finished bool // done is closed (or closedChan) and err set
	timer    *time.Timer
	stopBase func() bool
	afters   []*afterFunc
}

// newHandlerCtx returns the context of a handler serving req on the
// connection of peer. A zero deadline means none.
func newHandlerCtx(base context.Context, deadline time.Time, req *protocol.Message, peer *Peer) *handlerCtx {
	c := &handlerCtx{base: base, deadline: deadline,
		attachments: req.Attachments, idempotencyKey: req.IdempotencyKey, peer: peer}
	c.req.Store(req)
	return c
}

// afterFunc is a function registered by AfterFunc. Its pointer tells
// registrations of the same function apart.
type afterFunc struct{ f func() }

// closedChan is the Done channel of a context finished before anyone asked.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

var _ context.Context = (*handlerCtx)(nil)

// Deadline returns the request's deadline, if it came with a budget.
func (c *handlerCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

// handlerCtxKey is the context key under which a handler's context
// answers with itself, for Request and RequestMetadata.
type handlerCtxKey struct{}

// Value answers handlerCtxKey with c and peerKey with the connection's
// peer. It carries no other values.
func (c *handlerCtx) Value(key any) any {
	switch key.(type) {
	case handlerCtxKey:
		return c
	case peerKey:
		if c.peer != nil {
			return c.peer
		}
	}
	return nil
}

// Request returns the request a handler's ctx, or a context derived from
// it, was made for. A server gives a handler such a context for every
// two-way request and every request with a budget. Request returns nil
// for other contexts. Layers above read the request this way without
// wrapping the context in a new value per call.
//
// The message is valid only until the handler returns. After that Request
// returns nil: the message is reused. A context kept past the call may
// still read RequestMetadata.
func Request(ctx context.Context) *protocol.Message {
	if c, ok := ctx.Value(handlerCtxKey{}).(*handlerCtx); ok {
		return c.req.Load()
	}
	return nil
}

// RequestMetadata returns the attachments and the idempotency key of the
// request a handler's ctx, or a context derived from it, was made for.
// ok is false for any other context. Unlike Request, they stay valid
// after the handler returns, for work that goes on. The map is the
// request's own: read it, do not modify it.
func RequestMetadata(ctx context.Context) (attachments map[string]string, idempotencyKey string, ok bool) {
	c, ok := ctx.Value(handlerCtxKey{}).(*handlerCtx)
	if !ok {
		return nil, "", false
	}
	return c.attachments, c.idempotencyKey, true
}

// Done returns a channel closed at the deadline, on server close, on the
// client's cancel event, or when the handler returns.
func (c *handlerCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armLocked()
	return c.done
}

// Err returns context.DeadlineExceeded or context.Canceled once the
// context is done, else nil.
func (c *handlerCtx) Err() error {
	c.mu.Lock()
	if c.finished || c.done != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	err := c.expiredLocked()
	if err == nil {
		c.mu.Unlock()
		return nil
	}
	c.finishLocked(err) // nothing armed: nothing to stop or run
	c.mu.Unlock()
	return err
}

// AfterFunc runs f in its own goroutine once c is done; stop prevents
// that. context.WithCancel and context.AfterFunc look for this method.
func (c *handlerCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	c.armLocked()
	if c.finished {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	c.afters = append(c.afters, a)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.afters {
			if x == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false
	}
}

// expiredLocked returns the error c has by now, or nil, from the clock
// and the base context.
func (c *handlerCtx) expiredLocked() error {
	if c.base.Err() != nil {
		return context.Canceled
	}
	if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// armLocked makes the done channel and starts watching the deadline and
// the base context.
func (c *handlerCtx) armLocked() {
	if c.done != nil {
		return
	}
	if err := c.expiredLocked(); err != nil {
		c.finishLocked(err)
		return
	}
	c.done = make(chan struct{})
	if !c.deadline.IsZero() {
		c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.cancel(context.DeadlineExceeded) })
	}
	c.stopBase = context.AfterFunc(c.base, func() { c.cancel(context.Canceled) })
}

// finishLocked marks c done with err. The caller stops the timer and the
// base watch, and runs the after funcs, outside the lock.
func (c *handlerCtx) finishLocked(err error) {
	c.finished = true
	c.err = err
	if c.done == nil {
		c.done = closedChan
	} else {
		close(c.done)
	}
}

// cancel finishes c with err unless it is already done.
func (c *handlerCtx) cancel(err error) {
	c.mu.Lock()
	if c.finished {
		c.mu.Unlock()
		return
	}
	c.finishLocked(err)
	timer, stopBase, afters := c.timer, c.stopBase, c.afters
	c.afters = nil
	c.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if stopBase != nil {
		stopBase()
	}
	for _, a := range afters {
		go a.f()
	}
}

// String names the context in panics and logs.
func (c *handlerCtx) String() string {
	if c.deadline.IsZero() {
		return "transport.handlerCtx"
	}
	return "transport.handlerCtx(deadline " + c.deadline.Format(time.RFC3339Nano) + ")"
}
