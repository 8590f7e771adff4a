// Ping: a heartbeat round trip on an address's connections, the probe of a circuit breaker.

package transport

import (
	"context"
	"fmt"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// Ping sends a heartbeat on each open connection to addr that carries
// small calls, and waits for every answer. With none open it dials one
// first. It returns nil once each answered. It fails when ctx ends first,
// when a connection breaks meanwhile, when the pool is closed, and when
// addr is read-only or in dial backoff. It sends no request: no handler
// runs on the server.
func (p *Pool) Ping(ctx context.Context, addr string) error {
	e := (*p.eps.Load())[addr]
	if e == nil {
		var err error
		if e, err = p.endpoint(addr); err != nil {
			return err
		}
	}
	var conns []*clientConn
	for i := range p.cfg.ConnsPerAddr {
		if c := e.slots[i].Load(); c.usable() {
			conns = append(conns, c)
		}
	}
	if len(conns) == 0 || e.readOnly.Load() {
		c, err := e.slowConn(ctx, 0, time.Time{}, 0)
		if err != nil {
			return err
		}
		conns = []*clientConn{c}
	}
	for _, c := range conns {
		if err := c.ping(ctx); err != nil {
			return err
		}
	}
	return nil
}

// ping sends a heartbeat on c and waits for its answer until ctx or the
// pool ends. The heartbeat's id takes a place in the pending table, so the
// reader hands the answer here (event).
func (c *clientConn) ping(ctx context.Context) error {
	id := c.nextID.Add(1)
	cl := callPool.Get().(*call)
	if _, err := c.register(id, cl, false); err != nil {
		callPool.Put(cl)
		return err
	}
	// A peer that stopped reading must not hold the caller in a write:
	// the frame is queued and flushed on a goroutine of the pool's.
	if c.w.queueEvent(eventHeartbeat, id) {
		if c.ep.p.goTracked() {
			go func() {
				defer c.ep.p.wg.Done()
				_ = c.w.flush() // a failed write closes the connection itself
			}()
		}
	}
	select {
	case m := <-cl.ch:
		callPool.Put(cl)
		if m == nil {
			return &protocol.Error{Status: protocol.StatusChannelInactive, Msg: "connection lost", Err: c.closeErr()}
		}
		putMessage(m)
		return nil
	case <-ctx.Done():
		c.abandon(id, cl, false)
		callPool.Put(cl)
		return protocol.ContextError(ctx.Err(), true)
	case <-c.ep.p.ctx.Done():
		c.abandon(id, cl, false)
		callPool.Put(cl)
		return fmt.Errorf("transport: ping %s: %w", c.ep.addr, ErrClosed)
	}
}
