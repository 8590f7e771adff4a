// The probe that finds a server restarted at a read-only address.

package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// probe dials the read-only address in the background, once none of its
// connections is left and the dial backoff allows. The pool calls it
// itself: when a connection to the address closes, when a dial to it
// fails, and when the backoff it armed runs out. So a server restarted
// there is found with no call sent to it, and asking ReadOnly does no I/O.
func (e *endpoint) probe() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.readOnly.Load() || e.forgotten.Load() || e.dial != nil || e.p.ctx.Err() != nil {
		return // a dial in flight probes again when it fails
	}
	for i := range e.slots {
		if c := e.slots[i].Load(); c != nil && !c.isClosed() {
			return // the old server is still draining it; its close probes
		}
	}
	if wait := time.Until(e.retryAt); wait > 0 {
		if e.reprobe == nil {
			e.reprobe = time.AfterFunc(wait, e.probe)
		} else {
			e.reprobe.Reset(wait)
		}
		return
	}
	if !e.p.goTracked() {
		return
	}
	// The new connection must answer a heartbeat before it is used and
	// the mark goes. A server still draining answers with the read-only
	// event instead: a failed dial, so the next probe waits out the
	// backoff. One that accepted without serving does not answer at all.
	d := &dialing{done: make(chan struct{}), probe: true}
	e.dial = d
	go e.dialSlot(0, d)
}

// stopProbing stops the probe armed for later, if any.
func (e *endpoint) stopProbing() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.reprobe != nil {
		e.reprobe.Stop()
	}
}

// errStillReadOnly is a probe's dial answered with the read-only event.
var errStillReadOnly = errors.New("transport: the address answered with the read-only event")

// verify sends a heartbeat on the freshly dialed nc and reads its answer
// within the dial timeout. It reads no further than that frame: the
// connection goes to its reader afterwards.
func (e *endpoint) verify(nc net.Conn) error {
	_ = nc.SetDeadline(time.Now().Add(e.p.cfg.DialTimeout))
	defer nc.SetDeadline(time.Time{})
	// Pool.Close waits for this goroutine: it must not wait out the timeout.
	stop := context.AfterFunc(e.p.ctx, func() { _ = nc.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := nc.Write(protocol.AppendHeartbeat(nil, 1)); err != nil {
		return fmt.Errorf("transport: probe %s: %w", e.addr, err)
	}
	var m protocol.Message
	if _, err := io.ReadFull(nc, m.Header[:]); err != nil {
		return fmt.Errorf("transport: probe %s: %w", e.addr, err)
	}
	if n := m.Header.BodyLen(); m.Header.Magic() != protocol.Magic || !m.Header.Flags().IsEvent() || n > 64 {
		return fmt.Errorf("transport: probe %s: unexpected answer to a heartbeat: %w", e.addr, protocol.ErrMalformed)
	}
	m.Payload = make([]byte, m.Header.BodyLen())
	if _, err := io.ReadFull(nc, m.Payload); err != nil {
		return fmt.Errorf("transport: probe %s: %w", e.addr, err)
	}
	switch {
	case m.IsHeartbeatResponse():
		return nil
	case m.IsReadOnly():
		return errStillReadOnly
	}
	return fmt.Errorf("transport: probe %s: unexpected answer to a heartbeat: %w", e.addr, protocol.ErrMalformed)
}
