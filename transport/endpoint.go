// One address of a Pool: its connection slots, its dials with their backoff, its read-only mark.

package transport

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// Backoff after failed dials to one address: first delay, and cap.
const (
	backoffMin = 50 * time.Millisecond
	// backoffMax bounds how late an address that comes back is dialed
	// again. An instance that was down for a while but never left the
	// instance list is called within a second of its return; a dial a
	// second per dead address costs little.
	backoffMax = time.Second
)

// endpoint is one address: its connection slots, dial state and read-only
// mark.
type endpoint struct {
	p        *Pool
	addr     string
	rr       atomic.Uint32 // round-robin cursor
	readOnly atomic.Bool
	// downUntil is retryAt in Unix nanoseconds while the last dial
	// failed, 0 once one succeeds: backingOff reads it without mu.
	downUntil atomic.Int64
	// forgotten: Forget dropped the address; its connections retire.
	forgotten atomic.Bool
	slots     []atomic.Pointer[clientConn]
	pace      *pacer // schedules the large requests; nil: neither bounded nor paced

	mu       sync.Mutex  // guards the fields below
	dial     *dialing    // the dial in flight, if any
	failures int         // consecutive failed dials
	retryAt  time.Time   // no dial before this (backoff)
	lastErr  error       // the last dial error
	reprobe  *time.Timer // runs probe when the backoff ends
}

// smallInFlight reports whether a call over one of the shared (small
// request) connections is waiting for its response.
func (e *endpoint) smallInFlight() bool {
	for i := range e.p.cfg.ConnsPerAddr {
		if c := e.slots[i].Load(); c != nil && c.pendingLen() > 0 {
			return true
		}
	}
	return false
}

// dialing is one dial in flight, shared by every caller that needs it.
type dialing struct {
	done  chan struct{} // closed when c or err is set
	c     *clientConn
	err   error
	probe bool // a read-only address's probe: the connection must answer a heartbeat first
}

// markReadOnly records the read-only event and calls OnReadOnly once.
func (e *endpoint) markReadOnly() {
	if e.readOnly.CompareAndSwap(false, true) {
		e.p.log.Info("transport: address is read-only (shutting down)", "addr", e.addr)
		if f := e.p.cfg.OnReadOnly; f != nil {
			f(e.addr)
		}
	}
}

// detach empties c's slot and forgets c.
func (e *endpoint) detach(c *clientConn) {
	for i := range e.slots {
		e.slots[i].CompareAndSwap(c, nil)
	}
	e.p.forget(c)
	if e.readOnly.Load() {
		e.probe() // the old server's connections may all be gone now
	}
}

// slowConn finds a connection when slot i holds none usable. It waits for
// a dial, starting it if needed, and uses another live slot meanwhile. It
// fails fast while the address is read-only or in dial backoff.
func (e *endpoint) slowConn(ctx context.Context, i int, start time.Time, budget time.Duration) (*clientConn, error) {
	e.mu.Lock()
	if e.p.ctx.Err() != nil {
		e.mu.Unlock()
		return nil, errPoolClosed
	}
	if e.forgotten.Load() {
		e.mu.Unlock()
		return nil, protocol.NotSent(protocol.StatusChannelInactive, "address left the instance list: "+e.addr, nil)
	}
	c := e.slots[i].Load()
	readOnly := e.readOnly.Load()
	if c.usable() && !readOnly {
		e.mu.Unlock()
		return c, nil
	}
	if readOnly {
		// No new calls, and no dial for one: the probe finds a server
		// restarted there, and its heartbeat comes first. A call's own
		// dial could land in a draining server's accept queue after its
		// last Accept, and the reset when the listener closes would leave
		// the call sent and unanswered: ambiguous.
		e.mu.Unlock()
		return nil, protocol.NotSent(protocol.StatusChannelInactive, "address is read-only (shutting down): "+e.addr, nil)
	}
	var other *clientConn
	for j := range e.slots {
		if o := e.slots[j].Load(); o.usable() {
			other = o
			break
		}
	}
	d := e.dial
	if d == nil {
		if time.Now().Before(e.retryAt) {
			err := e.lastErr
			e.mu.Unlock()
			if other != nil {
				return other, nil
			}
			return nil, protocol.NotSent(protocol.StatusChannelInactive, "not dialing "+e.addr+" again yet", fmt.Errorf("%w: %w", ErrDialBackoff, err))
		}
		if !e.p.goTracked() {
			e.mu.Unlock()
			return nil, errPoolClosed
		}
		d = &dialing{done: make(chan struct{})}
		e.dial = d
		go e.dialSlot(i, d)
	}
	e.mu.Unlock()
	if other != nil {
		return other, nil
	}

	var timeout <-chan time.Time
	if budget > 0 {
		t := time.NewTimer(budget - time.Since(start))
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-d.done:
	case <-ctx.Done():
		return nil, protocol.ContextError(ctx.Err(), false)
	case <-timeout:
		return nil, protocol.NotSent(protocol.StatusClientTimeout, "timeout budget spent while dialing "+e.addr, nil)
	}
	if d.err != nil {
		return nil, protocol.NotSent(protocol.StatusChannelInactive, "cannot connect", d.err)
	}
	if !d.c.usable() {
		return nil, protocol.NotSent(protocol.StatusChannelInactive, "connection closed right after dialing "+e.addr, d.c.closeErr())
	}
	return d.c, nil
}

// failedLocked records a failed dial, or a connection the server refused
// at once, and backs off, with mu held.
func (e *endpoint) failedLocked(err error) {
	e.failures++
	delay := backoffMin << min(e.failures-1, 10)
	e.retryAt = time.Now().Add(min(delay, backoffMax))
	e.downUntil.Store(e.retryAt.UnixNano())
	e.lastErr = err
}

// backingOff reports whether a call to e now fails at once with
// ErrDialBackoff: its last dial failed less than the backoff ago, and it
// has no open connection (slowConn takes any open one).
func (e *endpoint) backingOff() bool {
	until := e.downUntil.Load()
	if until == 0 || time.Now().UnixNano() >= until {
		return false
	}
	for i := range e.slots {
		if e.slots[i].Load().usable() {
			return false
		}
	}
	return true
}

// refused records a connection the server refused before reading a
// request (see refusedError), so the next calls back off as after a
// failed dial.
func (e *endpoint) refused(err error) {
	e.mu.Lock()
	e.failedLocked(err)
	e.mu.Unlock()
}

// dialSlot dials addr for slot i and publishes the result to d.
func (e *endpoint) dialSlot(i int, d *dialing) {
	defer e.p.wg.Done()
	ctx, cancel := context.WithTimeout(e.p.ctx, e.p.cfg.DialTimeout)
	nc, err := e.p.cfg.Dial(ctx, e.addr)
	switch {
	case err != nil:
		err = fmt.Errorf("transport: dial %s: %w", e.addr, err)
	case e.p.cfg.TLS != nil:
		nc, err = e.handshake(ctx, nc) // the same budget as the dial
	}
	cancel()
	if err == nil && d.probe {
		if err = e.verify(nc); err != nil {
			_ = nc.Close()
		}
	}
	var c *clientConn
	if err == nil {
		c = newClientConn(e, nc)
		if !e.p.track(c) {
			_ = nc.Close()
			c, err = nil, ErrClosed
		}
	}

	back := false
	e.mu.Lock()
	if err != nil {
		e.failedLocked(err)
	} else {
		e.failures = 0
		e.retryAt = time.Time{}
		e.downUntil.Store(0)
		e.lastErr = nil
		e.slots[i].Store(c)
		back = e.readOnly.Swap(false) // a fresh connection: the address is back
	}
	e.dial = nil
	d.c, d.err = c, err
	close(d.done)
	e.mu.Unlock()

	if err != nil {
		e.p.log.Debug("transport: dial failed", "addr", e.addr, "err", err)
		if e.readOnly.Load() {
			e.probe() // again once the backoff ends
		}
		return
	}
	c.start()
	if e.forgotten.Load() {
		c.retire() // forgotten while it dialed
	}
	if back {
		e.p.log.Info("transport: address is back after its shutdown", "addr", e.addr)
		if f := e.p.cfg.OnBack; f != nil {
			f(e.addr)
		}
	}
}
