// One multiplexed client connection: its state, pending table, reader and heartbeats.

package transport

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// connState is where a clientConn is in its life. It only moves up, and
// may skip steps: open, goneAway, retiring, readOnly, closed.
type connState uint32

const (
	connOpen     connState = iota // takes new calls
	connGoneAway                  // the server closes it to make room: no new calls, closes when drained
	connRetiring                  // its address was forgotten: no new calls, closes when drained
	connReadOnly                  // the peer is shutting down: no new calls, closes when drained
	connClosed                    // closed for good; err says why
)

// clientConn is one multiplexed client connection: a pending table keyed
// by request id, the coalescing writer, one reader goroutine and one
// heartbeat timer.
type clientConn struct {
	ep     *endpoint
	nc     net.Conn
	w      frameWriter
	nextID atomic.Uint64
	live   liveness
	// state holds a connState. It is read without mu and moved under mu
	// (moveLocked).
	state atomic.Uint32

	// br and rd read the connection. Only the holder of the read token
	// touches them (readtoken.go).
	br *bufio.Reader
	rd *protocol.Reader

	mu      sync.Mutex       // guards the fields below and moves of state
	pending map[uint64]*call // two-way calls waiting for their response
	tok     readToken        // who reads the connection
	err     error            // why the connection closed: the first cause
	// refused says the server refused the connection before reading a
	// request (closeWith's notSent): nothing written on it was read.
	refused bool
	// wentAway says the server sent the go-away event: it runs nothing
	// sent on the connection from then on, and a call it has not
	// answered when the connection closes was not run.
	wentAway bool
	hb       *time.Timer // the heartbeat timer; nil once closed
}

func newClientConn(ep *endpoint, nc net.Conn) *clientConn {
	c := &clientConn{ep: ep, nc: nc, pending: make(map[uint64]*call)}
	c.tok.init()
	c.w.init(nc, c.writeFailed)
	return c
}

// load returns c's state.
func (c *clientConn) load() connState { return connState(c.state.Load()) }

// isClosed reports whether c is closed.
func (c *clientConn) isClosed() bool { return c.load() == connClosed }

// moveLocked moves c up to s, with mu held, and reports whether it moved.
// It is the only place state changes.
func (c *clientConn) moveLocked(s connState) bool {
	if s <= c.load() {
		// A read-only peer outranks a forgotten address, and nothing
		// leaves closed.
		return false
	}
	c.state.Store(uint32(s))
	return true
}

// start launches the reader goroutine and the heartbeat timer. The pool's
// WaitGroup counts the reader.
func (c *clientConn) start() {
	c.mu.Lock()
	if !c.isClosed() {
		c.hb = time.AfterFunc(c.ep.p.cfg.HeartbeatInterval, c.tick)
	}
	c.mu.Unlock()
	go c.readLoop()
}

// usable reports whether new calls may go to c.
func (c *clientConn) usable() bool {
	return c != nil && c.load() == connOpen
}

// retire takes no more calls on c and closes it after its last one.
func (c *clientConn) retire() { c.drain(connRetiring) }

// drain moves c to s, connGoneAway, connRetiring or connReadOnly, and
// closes it if no call is left.
func (c *clientConn) drain(s connState) {
	c.mu.Lock()
	c.moveLocked(s) // under mu: register checks the state there
	drained := c.drainedLocked()
	c.mu.Unlock()
	if drained {
		c.closeDrained()
	}
}

func (c *clientConn) writeFailed(err error) {
	c.close(fmt.Errorf("transport: write to %s: %w", c.ep.addr, err))
}

// close closes the connection and fails every pending call at once. Only
// the first close acts, and its err is kept; later ones do nothing.
func (c *clientConn) close(err error) { c.closeWith(err, false) }

// closeWith closes as close does. With notSent, the server provably read
// none of the pending requests, and each fails not sent.
func (c *clientConn) closeWith(err error, notSent bool) {
	c.mu.Lock()
	if !c.moveLocked(connClosed) {
		c.mu.Unlock()
		return
	}
	c.err = err
	c.refused = notSent
	wentAway := c.wentAway
	pend := c.pending
	c.pending = nil
	if c.hb != nil {
		c.hb.Stop()
		c.hb = nil
	}
	c.mu.Unlock()

	c.w.fail(err)
	_ = c.nc.Close()
	c.tok.wakeReader()
	for _, cl := range pend {
		switch {
		case notSent:
			cl.err = protocol.NotSent(protocol.StatusChannelInactive, "cannot connect", err)
		case wentAway:
			// The server had no call of this connection in flight when
			// it sent go-away, and runs none after it.
			cl.err = protocol.NotSent(protocol.StatusChannelInactive, "connection closed after go-away, unanswered: not run",
				fmt.Errorf("%w: %w", ErrGoneAway, err))
		}
		cl.ch <- nil
	}
	c.ep.detach(c)
	c.ep.p.log.Debug("transport: connection closed", "addr", c.ep.addr, "err", err)
}

// refusedErr returns why c closed when the server refused it before
// reading a request, else nil.
func (c *clientConn) refusedErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.refused {
		return nil
	}
	return c.err
}

// closeErr returns why c closed; valid after a nil was received from a
// call's channel.
func (c *clientConn) closeErr() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// register adds a pending call. It fails, with an error wrapping
// ErrNotSent, unless the connection is open.
// The state is checked under mu, where drainedLocked looks at the table:
// no call can join a draining connection that is about to close itself.
// With mayRead, the caller takes the read token when it is parked, and
// gen reports the grant (readtoken.go); else gen is 0.
func (c *clientConn) register(id uint64, cl *call, mayRead bool) (gen uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch c.load() {
	case connClosed:
		if c.wentAway {
			// It went away and closed after its last call, both since
			// the pick: the call goes on another connection.
			return 0, c.errGoneAway()
		}
		return 0, protocol.NotSent(protocol.StatusChannelInactive, "connection closed before sending", c.err)
	case connReadOnly:
		return 0, c.errReadOnly()
	case connRetiring:
		return 0, protocol.NotSent(protocol.StatusChannelInactive, "address left the instance list: "+c.ep.addr, nil)
	case connGoneAway:
		return 0, c.errGoneAway()
	}
	c.pending[id] = cl
	return c.grantLocked(mayRead), nil
}

// errGoneAway is the error of a call refused on a connection the server
// sent the go-away event on. It wraps errUnsentGoneAway.
func (c *clientConn) errGoneAway() error {
	return protocol.NotSent(protocol.StatusChannelInactive, "connection to "+c.ep.addr+" closing to make room at the server", errUnsentGoneAway)
}

// errUnsentGoneAway is the cause of a call refused before its request was
// written, on a connection that went away: Pool.RoundTrip sends it on
// another connection.
var errUnsentGoneAway = fmt.Errorf("%w before the request was written", ErrGoneAway)

func (c *clientConn) errReadOnly() error {
	return protocol.NotSent(protocol.StatusChannelInactive, "address is read-only (shutting down): "+c.ep.addr, nil)
}

// drainedLocked reports, with mu held, whether c is draining (retiring or
// read-only) with no call left. The caller then closes it.
func (c *clientConn) drainedLocked() bool {
	// That close tells a server shutting down that nothing more will
	// come. It keeps reading until then, answering late requests with
	// status 100, so it never drops a request it did not answer.
	s := c.load()
	return s != connOpen && s != connClosed && len(c.pending) == 0
}

// closeDrained closes c after its last call on a read-only or retiring
// connection.
func (c *clientConn) closeDrained() {
	why := "is shutting down"
	switch c.load() {
	case connRetiring:
		why = "left the instance list"
	case connGoneAway:
		why = "sent go-away (closing connections to make room)"
	}
	c.close(fmt.Errorf("transport: %s %s; closed the connection after its last call: %w", c.ep.addr, why, ErrClosed))
}

// maxSkipped is the largest body over MaxBody a reader drops to stay in
// step (failing only the frame's own call); a frame claiming more closes
// the connection.
const maxSkipped = 64 << 20

// skipResponse drops the body of a response over MaxBody. It fails that
// call alone with a local 50 (bad response; the server ran the call), so
// the calls sharing the connection do not suffer for it. It reports false
// when the connection must close: not a response, a claim over
// maxSkipped, or a body that could not be read.
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

// readLoop is the connection's reader goroutine. It reads frames while
// it holds the read token, and waits for the token while a caller or
// nobody holds it (readtoken.go).
func (c *clientConn) readLoop() {
	defer c.ep.p.wg.Done()
	c.br = bufio.NewReaderSize(c.live.source(c.nc), readBufferSize)
	c.rd = protocol.NewReader(c.br, c.ep.p.cfg.MaxBody)
	c.rd.SetSerializations(c.ep.p.cfg.Serializations)
	// The first bytes tell whether the server took the connection at all.
	b, err := c.br.Peek(2)
	if refused := refusedError(c.ep.addr, c.ep.p.cfg.TLS != nil, b, err); refused != nil {
		c.ep.refused(refused)
		c.closeWith(refused, true)
		return
	}
	for c.readFrames() && c.awaitToken() {
	}
}

// readFrames reads and delivers frames until the connection fails
// (false) or the reader parks the read token (true). It parks when no
// call is left waiting, nothing is buffered, and the last answer came
// alone. After a burst of answers it keeps the token and reads on.
func (c *clientConn) readFrames() bool {
	n := 0 // frames delivered since the pending table was last found empty
	for {
		m := getMessage()
		if err := c.rd.Read(m); err != nil {
			if !c.readFailed(m, err) {
				return false
			}
			continue
		}
		c.deliver(m)
		n++
		if c.br.Buffered() == 0 {
			switch c.park(n <= 1) {
			case parked:
				return true
			case emptied:
				n = 0
			}
		}
	}
}

// readFailed handles an error of rd.Read into m and puts m back. It
// reports whether reading goes on: a response over MaxBody fails its own
// call alone; anything else closes the connection.
func (c *clientConn) readFailed(m *protocol.Message, err error) bool {
	defer putMessage(m)
	switch {
	case errors.Is(err, protocol.ErrBodyTooLarge) && c.skipResponse(c.br, m, err):
		return true
	case errors.Is(err, protocol.ErrUnknownSerialization):
		c.foreign(m, err)
	default:
		c.close(readError(c.ep.addr, err))
	}
	return false
}

// deliver hands a frame read from the connection to whoever waits for it.
func (c *clientConn) deliver(m *protocol.Message) {
	f := m.Header.Flags()
	if f.IsEvent() {
		c.event(m)
		putMessage(m)
		return
	}
	if f.IsRequest() {
		putMessage(m) // a client serves nothing but events
		return
	}
	cl, ok, drained := c.take(m.Header.ID())
	if !ok {
		putMessage(m) // its caller gave up: discard the late response
		return
	}
	cl.ch <- m
	if drained {
		c.closeDrained() // the read then fails and the loop ends
	}
}

// foreign fails the call of a frame in a serialization dabb does not
// have, and closes the connection: the peer is not a dabb server.
func (c *clientConn) foreign(m *protocol.Message, err error) {
	id := m.Header.Flags().Serialization()
	err = fmt.Errorf("transport: %s is not a dabb server: it sent a frame in serialization %s (id %d), status %d: %w",
		c.ep.addr, protocol.SerializationName(id), id, m.Header.Status(), err)
	if m.Header.Flags().IsRequest() {
		c.close(err)
		return
	}
	if cl, ok, _ := c.take(m.Header.ID()); ok {
		cl.err = &protocol.Error{Status: protocol.StatusBadResponse, Msg: err.Error(), Err: err}
		cl.ch <- nil
	}
	c.close(err)
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
	case m.IsHeartbeatResponse():
		// The answer to a Ping waits in the pending table; one to the
		// timer's own heartbeat finds no entry there.
		if cl, ok, drained := c.take(m.Header.ID()); ok {
			cl.ch <- getMessage() // m goes back to the pool after event; ping releases this one
			if drained {
				c.closeDrained()
			}
		}
	case m.IsReadOnly():
		// Mark the address before this connection refuses calls or goes.
		// So callers never fall back on its other connections meanwhile.
		// And a caller refused here finds the address read-only when it
		// asks why (Pool.ReadOnly).
		c.ep.markReadOnly()
		c.drain(connReadOnly)
	case m.IsGoAway():
		// This connection alone: the server closes it to make room for
		// another. New calls go to a new connection; the server answers
		// 100 to what it reads here from now on.
		c.mu.Lock()
		c.wentAway = true
		c.mu.Unlock()
		c.drain(connGoneAway)
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
