package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// readBufferSize is the size of each connection's bufio.Reader.
const readBufferSize = 16 << 10

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

// msgPool holds the response messages handed to callers (returned with
// Pool.Release) and the server's request/response pairs' storage.
var msgPool = sync.Pool{New: func() any { return new(protocol.Message) }}

func getMessage() *protocol.Message { return msgPool.Get().(*protocol.Message) }

// putMessage pools a message that was read into; a large body buffer goes
// back to the shared buffer pool (Recycle), not with the message.
func putMessage(m *protocol.Message) {
	m.Recycle()
	msgPool.Put(m)
}

// clientConn is one multiplexed client connection: a pending table keyed
// by request id, the coalescing writer, one reader goroutine and one
// heartbeat timer.
type clientConn struct {
	ep     *endpoint
	nc     net.Conn
	w      frameWriter
	nextID atomic.Uint64
	live   liveness
	// readOnly is set when the peer sent the read-only event: no new
	// calls go to this connection, pending ones finish, and the
	// connection closes itself as soon as none is left (see drainedLocked).
	readOnly atomic.Bool
	retiring atomic.Bool // the pool forgot its address: no new calls, closes when drained
	dead     atomic.Bool // closed; mirrors closed for lock-free checks

	mu      sync.Mutex       // guards the fields below
	pending map[uint64]*call // two-way calls waiting for their response
	closed  bool
	err     error       // why the connection closed
	hb      *time.Timer // the heartbeat timer; nil once closed
}

func newClientConn(ep *endpoint, nc net.Conn) *clientConn {
	c := &clientConn{ep: ep, nc: nc, pending: make(map[uint64]*call)}
	c.w.init(nc, c.writeFailed)
	return c
}

// start launches the reader goroutine and the heartbeat timer. The pool's
// WaitGroup counts the reader.
func (c *clientConn) start() {
	c.mu.Lock()
	if !c.closed {
		c.hb = time.AfterFunc(c.ep.p.cfg.HeartbeatInterval, c.tick)
	}
	c.mu.Unlock()
	go c.readLoop()
}

// usable reports whether new calls may go to c.
func (c *clientConn) usable() bool {
	return c != nil && !c.dead.Load() && !c.readOnly.Load() && !c.retiring.Load()
}

// retire takes no more calls on c and closes it after its last one.
func (c *clientConn) retire() {
	c.mu.Lock()
	c.retiring.Store(true) // under mu: register checks it there
	drained := c.drainedLocked()
	c.mu.Unlock()
	if drained {
		c.closeDrained()
	}
}

func (c *clientConn) writeFailed(err error) {
	c.close(fmt.Errorf("transport: write to %s: %w", c.ep.addr, err))
}

// close closes the connection once, failing every pending call at once.
func (c *clientConn) close(err error) {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return
	}
	c.closed = true
	c.dead.Store(true)
	c.err = err
	pend := c.pending
	c.pending = nil
	if c.hb != nil {
		c.hb.Stop()
		c.hb = nil
	}
	c.mu.Unlock()

	c.w.fail(err)
	_ = c.nc.Close()
	for _, cl := range pend {
		cl.ch <- nil
	}
	c.ep.detach(c)
	c.ep.p.log.Debug("transport: connection closed", "addr", c.ep.addr, "err", err)
}

// closeErr returns why c closed; valid after a nil was received from a
// call's channel.
func (c *clientConn) closeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// register adds a pending call. It fails, with an error wrapping
// ErrNotSent, when the connection is closed or read-only: checking
// readOnly under mu, where drainedLocked looks at the table, means no call
// can join a read-only connection that is about to close itself.
func (c *clientConn) register(id uint64, cl *call) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return protocol.NotSent(protocol.StatusChannelInactive, "connection closed before sending", c.err)
	}
	if c.readOnly.Load() {
		return c.errReadOnly()
	}
	if c.retiring.Load() {
		return protocol.NotSent(protocol.StatusChannelInactive, "address left the instance list: "+c.ep.addr, nil)
	}
	c.pending[id] = cl
	return nil
}

func (c *clientConn) errReadOnly() error {
	return protocol.NotSent(protocol.StatusChannelInactive, "address is read-only (shutting down): "+c.ep.addr, nil)
}

// drainedLocked reports, with mu held, whether c got the read-only event,
// has no call left and is still open. The caller then closes it: that
// close tells the server nothing more will come on this connection, so
// the server, which keeps reading until then (answering late requests
// with status 100), never drops a request it did not answer.
func (c *clientConn) drainedLocked() bool {
	return !c.closed && len(c.pending) == 0 && (c.readOnly.Load() || c.retiring.Load())
}

// closeDrained closes c after its last call on a read-only or retiring
// connection.
func (c *clientConn) closeDrained() {
	why := "is shutting down"
	if !c.readOnly.Load() {
		why = "left the instance list"
	}
	c.close(fmt.Errorf("transport: %s %s; closed the connection after its last call: %w", c.ep.addr, why, ErrClosed))
}

// closeIfDrained closes c if it is read-only with no call left.
func (c *clientConn) closeIfDrained() {
	c.mu.Lock()
	drained := c.drainedLocked()
	c.mu.Unlock()
	if drained {
		c.closeDrained()
	}
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
// never waits on the socket: the frame joins the writer's buffer, and
// when no other goroutine is flushing, the flush runs on a goroutine of
// its own (counted by the pool). On a connection that failed it does
// nothing. closeDrained closes the connection after the frame was written
// (the last call of a read-only connection); when the socket was full,
// the close may overtake the frame, which costs nothing: a server cancels
// the calls still running on a connection that closes.
func (c *clientConn) cancelRemote(id uint64, closeDrained bool) {
	flush := c.w.queueEvent(eventCancel, id)
	if !flush {
		if closeDrained {
			c.closeDrained()
		}
		return
	}
	finish := func() {
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

// maxSkipped is the largest body over MaxBody a reader drops to stay in
// step (failing only the frame's own call); a frame claiming more closes
// the connection.
const maxSkipped = 64 << 20

// skipResponse drops the body of a response whose header said it was
// larger than MaxBody, and fails its call alone with a local 50 (bad
// response; the server ran the call): the other calls sharing the
// connection do not suffer for one oversized answer. It reports false
// when the connection must close: not a response, a claim over
// maxSkipped, or the body could not be read.
func (c *clientConn) skipResponse(br *bufio.Reader, m *protocol.Message, tooLarge error) bool {
	n := m.Header.BodyLen()
	if f := m.Header.Flags(); f.IsRequest() || f.IsEvent() || n > maxSkipped {
		return false
	}
	if _, err := br.Discard(int(n)); err != nil {
		return false
	}
	cl, ok, drained := c.take(m.Header.ID())
	c.ep.p.log.Warn("transport: response body over MaxBody; dropped it", "addr", c.ep.addr, "err", tooLarge)
	if ok {
		cl.err = &protocol.Error{Status: protocol.StatusBadResponse,
			Msg: fmt.Sprintf("response of %d bytes is over MaxBody (%d)", n, c.ep.p.cfg.MaxBody), Err: tooLarge}
		cl.ch <- nil
	}
	if drained {
		c.closeDrained()
	}
	return true
}

// take removes the pending call of a response's id, if its caller still
// waits; drained reports that the connection, read-only, has no call left.
func (c *clientConn) take(id uint64) (cl *call, ok, drained bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok = c.pending[id]; ok {
		delete(c.pending, id)
		drained = c.drainedLocked()
	}
	return cl, ok, drained
}

// pendingLen returns the size of the pending table (for tests).
func (c *clientConn) pendingLen() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.pending)
}

// readLoop reads frames until the connection fails, handing each response
// to its caller.
func (c *clientConn) readLoop() {
	defer c.ep.p.wg.Done()
	br := bufio.NewReaderSize(c.live.source(c.nc), readBufferSize)
	rd := protocol.NewReader(br, c.ep.p.cfg.MaxBody)
	for {
		m := getMessage()
		if err := rd.Read(m); err != nil {
			if errors.Is(err, protocol.ErrBodyTooLarge) && c.skipResponse(br, m, err) {
				putMessage(m)
				continue
			}
			putMessage(m)
			c.close(readError(c.ep.addr, err))
			return
		}
		f := m.Header.Flags()
		if f.IsEvent() {
			c.event(m)
			putMessage(m)
			continue
		}
		if f.IsRequest() {
			putMessage(m) // a client serves nothing but events
			continue
		}
		cl, ok, drained := c.take(m.Header.ID())
		if !ok {
			putMessage(m) // its caller gave up: discard the late response
			continue
		}
		cl.ch <- m
		if drained {
			c.closeDrained() // the read then fails and the loop ends
		}
	}
}

func readError(addr string, err error) error {
	switch {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("transport: %s closed the connection: %w", addr, err)
	case errors.Is(err, protocol.ErrMalformed), errors.Is(err, protocol.ErrBadMagic), errors.Is(err, protocol.ErrBodyTooLarge):
		return fmt.Errorf("transport: bad frame from %s, closing: %w", addr, err)
	}
	return fmt.Errorf("transport: read from %s: %w", addr, err)
}

func (c *clientConn) event(m *protocol.Message) {
	switch {
	case m.IsHeartbeat():
		_ = c.w.writeEvent(eventHeartbeatResponse, m.Header.ID())
	case m.IsReadOnly():
		// Mark the address before this connection refuses calls or
		// goes, so callers never fall back on its other connections
		// meanwhile, and a caller refused here finds the address
		// read-only (Pool.ReadOnly) when it asks why.
		c.ep.markReadOnly()
		c.readOnly.Store(true)
		c.closeIfDrained()
	}
}

// tick runs once per heartbeat interval on the timer's goroutine.
// The timer is re-armed first, so a tick whose heartbeat write blocks does
// not stop the next tick from noticing the stall.
func (c *clientConn) tick() {
	c.mu.Lock()
	if c.hb == nil {
		c.mu.Unlock()
		return
	}
	c.hb.Reset(c.ep.p.cfg.HeartbeatInterval)
	c.mu.Unlock()
	switch c.live.tick(c.w.state()) {
	case tickHeartbeat:
		_ = c.w.writeEvent(eventHeartbeat, c.nextID.Add(1))
	case tickSilent:
		c.close(fmt.Errorf("transport: %s silent for %d heartbeat intervals: %w",
			c.ep.addr, silentTicks, errPeerSilent))
	case tickStalled:
		c.close(fmt.Errorf("transport: write to %s stalled: %w", c.ep.addr, errPeerSilent))
	}
}

var errPeerSilent = errors.New("transport: peer not responding")

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
		if c.readOnly.Load() {
			return nil, c.errReadOnly()
		}
		queued, err := c.write(ctx, req, remaining)
		if err != nil {
			return nil, c.writeError(queued, err)
		}
		return nil, nil
	}

	cl := callPool.Get().(*call)
	if err := c.register(id, cl); err != nil {
		callPool.Put(cl)
		return nil, err
	}
	queued, err := c.write(ctx, req, remaining)
	if err != nil {
		// A frame cut off by the caller's time is still finished, so the
		// server will run it: tell it the caller has gone.
		gaveUp := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
		c.abandon(id, cl, queued && gaveUp)
		callPool.Put(cl)
		return nil, c.writeError(queued, err)
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
