// The client Pool: its Config, and RoundTrip, Forget and Close over per-address endpoints.

package transport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// ErrNotSent matches every error whose request provably never left this
// process (no connection, pool closed, address read-only, budget spent
// before writing): it is safe to retry anywhere. It is
// [protocol.ErrNotSent].
var ErrNotSent = protocol.ErrNotSent

// ErrDialBackoff is wrapped by the error of a request
// refused because its address's last dial failed moments ago and the next
// is not due yet: nothing touched the network, so it repeats what that
// dial's failure said and is no new evidence about the address.
var ErrDialBackoff = errors.New("transport: dial backoff")

// ErrClosed reports a closed Pool or connection.
var ErrClosed = errors.New("transport: closed")

// Config configures a Pool. The zero value works.
type Config struct {
	// ConnsPerAddr is the number of connections kept to each address;
	// calls are spread over them round robin. Default 2.
	ConnsPerAddr int
	// LargeMessage: a request whose payload is at least this many bytes
	// goes over a connection of its own to its address (dialed when the
	// first such request comes), so that a large frame, and its large
	// response, never sit in front of small calls on one TCP stream.
	// Default 64 KiB; negative sends every request over the shared
	// connections.
	LargeMessage int
	// LargeInFlight bounds the large requests (see LargeMessage) in flight
	// to one address at once; the next waits for a slot, and the wait
	// counts against its budget (a call whose budget or context ends
	// while it waits fails as not sent). Large requests share one
	// connection, so a second one in flight gains little on the wire and
	// mostly adds CPU and memory pressure on both sides: with 16
	// goroutines making small calls and 2 making 1 MiB calls on one
	// client (dabbbench), a bound of 1 took the small calls' p99 from
	// 4.6-4.9 ms to 2.9 ms and their rate from 13k to 24k calls/s, for
	// 25 % fewer 1 MiB calls/s (780 → 595) at the same 1 MiB p99
	// (docs/performance.md, finding 5). Default 1;
	// negative means no bound. The slot is held until the response
	// arrives, handler time included: large calls whose handlers take a
	// while (uploads processed before the answer) run one at a time per
	// address, and a large call made through the same Pool to the same
	// address while one is waiting for its answer (calls that loop back,
	// A to B to A to B, with large payloads) waits for it, at most for
	// its budget. Such clients want a larger bound or none
	// (proxy.WithTransport).
	LargeInFlight int
	// LargeShare is the share of the time large requests to one address
	// may take while small calls to it are in flight: when a large
	// request is about to go and a small call to the same address is
	// waiting for its answer, it first waits until the previous large
	// request's round trip, d, has been followed by a pause of
	// d·(1−LargeShare)/LargeShare (with the default, 3·d). Moving a
	// megabyte keeps both processes busy for a while, and the small calls
	// that land in that burst queue behind it; spacing the bursts keeps
	// their tail latency near its value without large calls, as HTTP/2's
	// flow control does for gRPC. With 16 goroutines making small calls
	// and 2 making 1 MiB calls on one client (dabbbench), the default
	// took the small calls' p99 from 5.1-5.5× its value without the
	// large calls to 2.5-2.8×, and their rate from ~30k to ~70k calls/s,
	// for 70 % fewer 1 MiB calls/s (700-760 to 200-230; a third gave
	// 2.6-3.2× at ~290; see docs/performance.md, finding 5). With no
	// small call in flight large requests are not paced: bulk transfers
	// alone keep their full rate. A pause lasts 100 ms at most (a large
	// call that waited for a slow server does not hold the next ones back
	// for three times as long), and counts against the large call's
	// budget, like the wait for a LargeInFlight slot. Default 0.25; 1 or
	// more, or negative, turns pacing off.
	LargeShare float64
	// DialTimeout bounds one dial. Default 3s.
	DialTimeout time.Duration
	// HeartbeatInterval: a connection that read nothing for this long
	// sends a heartbeat; one silent for 3 intervals is closed.
	// Default 60s.
	HeartbeatInterval time.Duration
	// MaxBody limits the body of a response: a larger one is read and
	// dropped and its call alone fails with a local status 50 (bad
	// response; the server ran it), unless it claims more than 64 MiB,
	// which closes the connection. It also bounds the payload of a request: a larger one
	// fails at once, not sent (status 90, wrapping
	// protocol.ErrBodyTooLarge), as the peer's default limit would refuse
	// it. Default protocol.DefaultMaxBody.
	MaxBody uint32
	// Dial opens a connection. Default: a net.Dialer over TCP.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// OnReadOnly is called, from a connection's reader goroutine, when
	// addr sends the read-only event (it is shutting down). It must not
	// block.
	OnReadOnly func(addr string)
	// OnBack is called, from the goroutine that dialed, when an address
	// that sent the read-only event has a usable connection again: a
	// server was restarted there. It must not block.
	OnBack func(addr string)
	// Logger receives connection events. Nil means slog.Default().
	Logger *slog.Logger
}

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
	if cfg.LargeMessage == 0 {
		cfg.LargeMessage = 64 << 10
	}
	if cfg.ConnsPerAddr <= 0 {
		cfg.ConnsPerAddr = 2
	}
	if cfg.LargeInFlight == 0 {
		cfg.LargeInFlight = 1
	}
	if cfg.LargeShare == 0 {
		cfg.LargeShare = 0.25
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 60 * time.Second
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = protocol.DefaultMaxBody
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
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
// caller's; RoundTrip sets its id. The wait lasts until the response
// arrives, ctx is done, or, when req.Timeout > 0, req.Timeout has elapsed
// since RoundTrip was entered; the budget left when the frame is written is
// what travels to the server. A one-way request (no FlagTwoWay) returns
// (nil, nil) once written.
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
// A call that gives up leaves the pending table at once; its late response
// is discarded. If its request was written and no response had arrived,
// the cancel event for it follows on the same connection, so the server
// cancels the handler's context (best effort: it is queued without
// waiting for the socket, and skipped when the connection is gone).
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
	if large := p.cfg.LargeMessage; large > 0 && len(req.Payload) >= large {
		i = p.cfg.ConnsPerAddr
		if e.pace != nil {
			start = time.Now()
			sent, err := e.pace.acquire(ctx, start, req.Timeout)
			if err != nil {
				return nil, err
			}
			defer e.pace.release(sent)
		}
	} else {
		i = int(e.rr.Add(1)) % p.cfg.ConnsPerAddr
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
	return c.roundTrip(ctx, req, start)
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

// Forget drops addr, an address no instance list holds any more (a client
// whose instances come and go at new addresses would otherwise keep every
// one it ever called): no new call goes to its connections, each closes
// after its last call in flight, and a later call to addr starts afresh
// (a new dial, no backoff or read-only mark).
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
	e.pace = newPacer(&p.cfg, addr, e.smallInFlight, p.ctx.Done())
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
