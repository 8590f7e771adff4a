// The client Pool: RoundTrip, ReadOnly, Forget and Close over per-address endpoints.

package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// ErrNotSent matches every error whose request provably never left this
// process: no connection, pool closed, address read-only, or budget spent
// before writing. Such a request is safe to retry anywhere. It is
// [protocol.ErrNotSent].
var ErrNotSent = protocol.ErrNotSent

// ErrDialBackoff is wrapped by the error of a request refused because its
// address's last dial failed moments ago. Nothing touched the network: the
// error repeats that dial's failure and is no new evidence about the
// address.
var ErrDialBackoff = errors.New("transport: dial backoff")

// ErrGoneAway is wrapped by the error of a request refused, not sent, on a
// connection whose server sent the go-away event: it is closing that
// connection to make room for a new one (ServerConfig.MaxConns). The
// address is fine; RoundTrip sends such a request on another connection
// itself.
var ErrGoneAway = errors.New("transport: connection going away")

// ErrClosed reports a closed Pool or connection.
var ErrClosed = errors.New("transport: closed")

// Pool keeps multiplexed connections to many addresses and sends requests
// over them. Create it with NewPool; it is safe for concurrent use.
type Pool struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context // cancelled by Close; parent of dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // reader and dial goroutines

	// eps maps an address to its endpoint. Copy on write: RoundTrip
	// reads it with one atomic load and no lock.
	eps atomic.Pointer[map[string]*endpoint]

	mu     sync.Mutex // guards the fields below and writes to eps
	closed bool
	conns  map[*clientConn]struct{}
}

// NewPool returns a Pool. It does no I/O: connections are dialed on the
// first RoundTrip to each address.
func NewPool(cfg Config) *Pool {
	cfg = cfg.withDefaults()
	p := &Pool{cfg: cfg, log: cfg.Logger, conns: make(map[*clientConn]struct{})}
	if p.log == nil {
		p.log = slog.Default()
	}
	p.ctx, p.cancel = context.WithCancel(context.Background())
	empty := map[string]*endpoint{}
	p.eps.Store(&empty)
	return p
}

// RoundTrip sends req to addr and waits for the response.
//
// req.Header's flags (request, two-way, serialization id) are the
// caller's; RoundTrip sets its id. The wait ends when the response
// arrives or ctx is done. With req.Timeout > 0, it also ends once
// req.Timeout has passed since RoundTrip was entered. The budget left when
// the frame is written is what travels to the server. A one-way request
// (no FlagTwoWay) returns (nil, nil) once written.
//
// An OK response is returned; call Release when done with it. A non-OK
// response is released here and its remote *protocol.Error returned. Local
// failures are a *protocol.Error with Remote false:
//
//   - 35 wrapping ErrNotSent: no connection, dial in backoff, pool closed,
//     address read-only, or the frame was never written;
//   - 30 wrapping ErrNotSent: the budget or ctx deadline ran out before the
//     frame was written; 31: after it was written;
//   - 90 with the ctx error: ctx cancelled (wrapping ErrNotSent too if not
//     yet written);
//   - 35 without ErrNotSent: the connection broke after the frame was
//     written; the server may have acted.
//
// A call that gives up leaves the pending table at once, and its late
// response is discarded. If its request was written, the cancel event for
// it follows on the same connection, and the server cancels the handler's
// context. That event is best effort: it never waits for the socket, and
// a connection that is gone carries none.
func (p *Pool) RoundTrip(ctx context.Context, addr string, req *protocol.Message) (*protocol.Message, error) {
	if req == nil {
		return nil, protocol.NotSent(protocol.StatusClientError, "nil request", nil)
	}
	if f := req.Header.Flags(); !f.IsRequest() || f.IsEvent() {
		return nil, protocol.NotSent(protocol.StatusClientError,
			fmt.Sprintf("flags %#02x: a call needs FlagRequest and no FlagEvent", byte(f)), nil)
	}
	if n := len(req.Payload); uint64(n) > uint64(p.cfg.MaxBody) {
		return nil, protocol.NotSent(protocol.StatusClientError,
			fmt.Sprintf("request payload of %d bytes is over MaxBody (%d)", n, p.cfg.MaxBody), protocol.ErrBodyTooLarge)
	}
	if req.Attachments != nil {
		if err := protocol.CheckAttachments(req); err != nil {
			return nil, protocol.NotSent(protocol.StatusClientError, "request over the attachment limit", err)
		}
	}
	// start stays zero on the fast path: a ready connection writes at
	// once, and the budget is req.Timeout whole. Waiting for a connection
	// counts against it.
	var start time.Time
	e := (*p.eps.Load())[addr]
	if e == nil {
		var err error
		if e, err = p.endpoint(addr); err != nil {
			return nil, err
		}
	}
	var i int
	timed := false
	if large := p.cfg.LargeMessage; large > 0 && len(req.Payload) >= large {
		i = p.cfg.ConnsPerAddr
		if e.pace != nil {
			start = time.Now()
			turn, err := e.pace.acquire(ctx, start, req.Timeout)
			if err != nil {
				return nil, err
			}
			defer e.pace.release(turn)
		}
	} else {
		n := e.rr.Add(1)
		i = int(n) % p.cfg.ConnsPerAddr
		// A whole turn of the connections in sampleEvery is timed: each
		// connection's calls count. Until a large request has gone there
		// is no share to adapt, and no call is timed.
		timed = e.pace != nil && e.pace.adaptive && (n/uint32(p.cfg.ConnsPerAddr))%sampleEvery == 0 && e.pace.started.Load() > 0
	}
	c := e.slots[i].Load()
	if !c.usable() || e.readOnly.Load() {
		if req.Timeout > 0 && start.IsZero() {
			start = time.Now()
		}
		var err error
		if c, err = e.slowConn(ctx, i, start, req.Timeout); err != nil {
			return nil, err
		}
	}
	if timed {
		return e.pace.timeSmall(ctx, c, req, start)
	}
	return e.send(ctx, i, c, req, start)
}

// send makes req's round trip on c, the connection picked from slot i.
// When the server sent go-away on c after the pick, c refuses the call
// before writing it, and another connection to the address takes it.
func (e *endpoint) send(ctx context.Context, i int, c *clientConn, req *protocol.Message, start time.Time) (*protocol.Message, error) {
	resp, err := c.roundTrip(ctx, req, start)
	if err != nil && errors.Is(err, errUnsentGoneAway) {
		if req.Timeout > 0 && start.IsZero() {
			start = time.Now()
		}
		if c, err = e.slowConn(ctx, i, start, req.Timeout); err != nil {
			return nil, err
		}
		return c.roundTrip(ctx, req, start)
	}
	return resp, err
}

// Release returns a response from RoundTrip to the pool. resp must not be
// used afterwards.
func (p *Pool) Release(resp *protocol.Message) {
	if resp != nil {
		putMessage(resp)
	}
}

// ReadOnly reports whether addr sent the read-only event. It stays true
// until a fresh connection to addr is dialed successfully. It takes no
// lock and does no I/O, so a balancer may ask it on every pick.
//
// The pool probes a read-only address by itself once its old connections
// are closed, spaced by the dial backoff. So a server restarted there is
// found without any call sent to it; OnBack reports it.
func (p *Pool) ReadOnly(addr string) bool {
	e := (*p.eps.Load())[addr]
	return e != nil && e.readOnly.Load()
}

// BackingOff reports whether a call to addr now fails at once with
// ErrDialBackoff: the last dial there failed less than the backoff ago
// (50 ms, doubling to 1 s), and no connection to it is open. A balancer
// leaves such an address out while another can take the call.
func (p *Pool) BackingOff(addr string) bool {
	e := (*p.eps.Load())[addr]
	return e != nil && e.backingOff()
}

// Close closes every connection, failing pending calls with status 35, and
// waits for the pool's goroutines to exit. Later RoundTrips fail with
// ErrNotSent.
func (p *Pool) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	conns := make([]*clientConn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	p.cancel()
	for _, e := range *p.eps.Load() {
		e.stopProbing()
	}
	for _, c := range conns {
		c.close(ErrClosed)
	}
	p.wg.Wait()
	return nil
}

var errPoolClosed = protocol.NotSent(protocol.StatusChannelInactive, "pool closed", ErrClosed)

// Forget drops addr, an address no instance list holds any more. No new
// call goes to its connections, and each closes after its last call in
// flight. A later call to addr starts afresh: a new dial, with no backoff
// or read-only mark. Without it, a client whose instances come and go at
// new addresses would keep every one it ever called.
func (p *Pool) Forget(addr string) {
	p.mu.Lock()
	old := *p.eps.Load()
	e := old[addr]
	if e == nil || p.closed {
		p.mu.Unlock()
		return
	}
	m := make(map[string]*endpoint, len(old))
	for k, v := range old {
		if k != addr {
			m[k] = v
		}
	}
	p.eps.Store(&m)
	p.mu.Unlock()
	e.forgotten.Store(true)
	e.stopProbing()
	for i := range e.slots {
		if c := e.slots[i].Load(); c != nil {
			c.retire()
		}
	}
}

// endpoint returns addr's endpoint, creating it.
func (p *Pool) endpoint(addr string) (*endpoint, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, errPoolClosed
	}
	old := *p.eps.Load()
	if e := old[addr]; e != nil {
		return e, nil
	}
	n := p.cfg.ConnsPerAddr
	if p.cfg.LargeMessage > 0 {
		n++ // the last slot carries the large requests
	}
	e := &endpoint{p: p, addr: addr, slots: make([]atomic.Pointer[clientConn], n)}
	e.pace = newPacer(&p.cfg, addr, e.smallInFlight, e.rr.Load, p.ctx.Done())
	m := make(map[string]*endpoint, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	m[addr] = e
	p.eps.Store(&m)
	return e, nil
}

// track registers a new connection; false when the pool is closed.
func (p *Pool) track(c *clientConn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.conns[c] = struct{}{}
	p.wg.Add(1) // the reader
	return true
}

// goTracked counts a goroutine about to start; false when the pool is
// closed (Close's Wait must not race with a late Add).
func (p *Pool) goTracked() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.wg.Add(1)
	return true
}

func (p *Pool) forget(c *clientConn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// pendingLen returns the number of pending calls to addr (for tests).
func (p *Pool) pendingLen(addr string) int {
	e := (*p.eps.Load())[addr]
	if e == nil {
		return 0
	}
	n := 0
	for i := range e.slots {
		if c := e.slots[i].Load(); c != nil {
			n += c.pendingLen()
		}
	}
	return n
}
