// The read token: a caller alone on its connection reads its own answer, with no hand-off.

package transport

import (
	"context"
	"errors"
	"os"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// tokenLook is how often the reader goroutine looks at a parked token.
// The token comes back to it once a whole period went by without a
// caller taking it. So an idle connection is read again within two
// periods, and sees a close or an event as it did before.
const tokenLook = 5 * time.Millisecond

// tokenHolder says who reads a client connection.
type tokenHolder uint8

const (
	tokReader tokenHolder = iota // the reader goroutine
	tokParked                    // nobody: no call waits, nothing is buffered
	tokCaller                    // the one caller that took it while parked
)

// readToken says who reads a connection. Its fields are guarded by the
// connection's mu, except timer, the reader goroutine's own.
type readToken struct {
	holder tokenHolder
	gen    uint64        // grants to callers so far
	seen   uint64        // gen at the reader's last look
	kept   uint64        // times the reader kept the token with no call waiting
	wake   chan struct{} // capacity 1: something changed for the reader
	// timer times the reader's looks at a parked token.
	timer *time.Timer
}

func (t *readToken) init() { t.wake = make(chan struct{}, 1) }

// wakeReader tells the reader goroutine to look at the token.
func (t *readToken) wakeReader() {
	select {
	case t.wake <- struct{}{}:
	default:
	}
}

// grantLocked gives the token to the caller registering now when it is
// parked, and reports the grant (0: none). A caller that may not read
// wakes the reader instead. c.mu is held.
func (c *clientConn) grantLocked(mayRead bool) uint64 {
	if c.tok.holder != tokParked {
		return 0
	}
	if !mayRead {
		c.tok.holder = tokReader
		c.tok.wakeReader()
		return 0
	}
	c.tok.holder = tokCaller
	c.tok.gen++
	return c.tok.gen
}

// releaseLocked passes the token on from a caller: parked when no call
// waits and nothing is buffered, else to the reader goroutine. c.mu is
// held.
func (c *clientConn) releaseLocked() {
	if len(c.pending) == 0 && c.br.Buffered() == 0 && c.load() == connOpen {
		c.tok.holder = tokParked
		return
	}
	c.tok.holder = tokReader
	c.tok.wakeReader()
}

// release passes the token on from a caller.
func (c *clientConn) release() {
	c.mu.Lock()
	c.releaseLocked()
	c.mu.Unlock()
}

// toReader gives the token to the reader goroutine.
func (c *clientConn) toReader() {
	c.mu.Lock()
	c.tok.holder = tokReader
	c.tok.wakeReader()
	c.mu.Unlock()
}

// parkOutcome is what park did.
type parkOutcome uint8

const (
	stillWaiting parkOutcome = iota // calls wait: the reader reads on
	emptied                         // no call waits, but the reader keeps the token
	parked                          // the token is parked
)

// park parks the token of the reader goroutine when no call waits and
// alone says the answers came one at a time. The reader then waits in
// awaitToken.
func (c *clientConn) park(alone bool) parkOutcome {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.pending) != 0 || c.load() != connOpen {
		return stillWaiting
	}
	if !alone {
		// The answers came in a burst: more calls are likely to follow
		// at once. A caller taking the token would read for the others
		// and then wake the reader, a hand-off per burst.
		c.tok.kept++
		return emptied
	}
	c.tok.holder = tokParked
	c.tok.seen = c.tok.gen
	return parked
}

// awaitToken waits until the token is the reader goroutine's again. It
// reports false when the connection closed.
func (c *clientConn) awaitToken() bool {
	if c.tok.timer == nil {
		c.tok.timer = time.NewTimer(tokenLook)
	} else {
		c.tok.timer.Reset(tokenLook)
	}
	for {
		looked := false
		select {
		case <-c.tok.wake:
		case <-c.tok.timer.C:
			looked = true
		}
		c.mu.Lock()
		if c.load() == connClosed {
			c.mu.Unlock()
			c.tok.timer.Stop()
			return false
		}
		mine := c.tok.holder == tokReader
		if !mine && looked && c.tok.holder == tokParked && c.tok.gen == c.tok.seen {
			// Parked a whole period with no caller: idle. Read again.
			c.tok.holder = tokReader
			mine = true
		}
		c.tok.seen = c.tok.gen
		c.mu.Unlock()
		if mine {
			c.tok.timer.Stop()
			// A caller's deadline may still be set.
			_ = c.nc.SetReadDeadline(time.Time{})
			return true
		}
		if looked {
			c.tok.timer.Reset(tokenLook)
		}
	}
}

// interrupt ends the read of the caller holding grant gen, whose context
// ended. A later holder is left alone.
func (c *clientConn) interrupt(gen uint64) {
	c.mu.Lock()
	if c.tok.holder == tokCaller && c.tok.gen == gen {
		_ = c.nc.SetReadDeadline(aLongTimeAgo)
	}
	c.mu.Unlock()
}

// readOwn reads the connection, as the holder of grant gen, until the
// answer to call id comes, delivering the other frames on the way. done
// is false when the call must wait for its answer on cl.ch: the token
// went to the reader goroutine (a frame too large for the read buffer),
// or the connection closed. Otherwise it returns the call's outcome and
// has put cl back in its pool.
func (c *clientConn) readOwn(ctx context.Context, id uint64, cl *call, gen uint64, deadline time.Time) (m *protocol.Message, done bool, err error) {
	_ = c.nc.SetReadDeadline(deadline)
	var stop func() bool
	if ctx.Done() != nil {
		stop = context.AfterFunc(ctx, func() { c.interrupt(gen) })
	}
	for {
		n, err := frameLen(c.br)
		if err == nil && n > c.br.Size() {
			// The reader goroutine reads frames too large to wait for
			// here without losing a part at a deadline.
			stopWatch(stop)
			c.toReader()
			return nil, false, nil
		}
		if err == nil {
			_, err = c.br.Peek(n)
		}
		if err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) && !c.isClosed() {
				// Bytes of a frame read in part stay in the buffer, for
				// whoever reads next.
				switch {
				case ctx.Err() != nil:
					stopWatch(stop)
					c.abandon(id, cl, true)
					c.release()
					callPool.Put(cl)
					return nil, true, protocol.ContextError(ctx.Err(), true)
				case !deadline.IsZero() && !time.Now().Before(deadline):
					stopWatch(stop)
					c.abandon(id, cl, true)
					c.release()
					callPool.Put(cl)
					return nil, true, &protocol.Error{Status: protocol.StatusServerTimeout, Msg: "timed out waiting for the response",
						Err: context.DeadlineExceeded}
				}
				_ = c.nc.SetReadDeadline(deadline) // an interrupt meant for an earlier holder
				continue
			}
			stopWatch(stop)
			c.close(readError(c.ep.addr, err))
			return nil, false, nil
		}
		m := getMessage()
		if err := c.rd.Read(m); err != nil {
			if !c.readFailed(m, err) {
				stopWatch(stop)
				return nil, false, nil
			}
			continue
		}
		if f := m.Header.Flags(); f.IsEvent() || f.IsRequest() || m.Header.ID() != id {
			c.deliver(m)
			continue
		}
		stopWatch(stop)
		if !c.takeOwn(id) {
			// The connection closed under the answer, and sent the call
			// its nil. The answer stands.
			<-cl.ch
		}
		callPool.Put(cl)
		if m.Header.Status() != protocol.StatusOK {
			err := m.Err()
			putMessage(m)
			return nil, true, err
		}
		return m, true, nil
	}
}

func stopWatch(stop func() bool) {
	if stop != nil {
		stop()
	}
}

// takeOwn removes the holder's own call from the pending table and passes
// the token on. It reports false when the call was not there: the
// connection closed.
func (c *clientConn) takeOwn(id uint64) bool {
	c.mu.Lock()
	if _, ok := c.pending[id]; !ok {
		c.mu.Unlock()
		return false
	}
	delete(c.pending, id)
	drained := c.drainedLocked()
	c.releaseLocked()
	c.mu.Unlock()
	if drained {
		c.closeDrained()
	}
	return true
}
