package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
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

// Backoff after failed dials to one address: first delay, and cap.
const (
	backoffMin = 50 * time.Millisecond
	backoffMax = 5 * time.Second
)

// Pool keeps multiplexed connections to many addresses and sends requests
// over them. Create it with NewPool; it is safe for concurrent use.
type Pool struct {
	cfg    Config
	log    *slog.Logger
	ctx    context.Context // cancelled by Close; parent of dials
	cancel context.CancelFunc
	wg     sync.WaitGroup // reader and dial goroutines
	epoch  time.Time      // Pool.clock's zero

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
	p := &Pool{cfg: cfg, log: cfg.Logger, conns: make(map[*clientConn]struct{}), epoch: time.Now()}
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
		if e.large != nil || p.paced() {
			start = time.Now()
			sent, err := e.acquireLarge(ctx, start, req.Timeout)
			if err != nil {
				return nil, err
			}
			defer e.releaseLarge(sent)
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
// until a fresh connection to addr is dialed successfully. Asking about a
// read-only address whose old connections are all closed starts such a
// dial in the background (one at a time, in the usual dial backoff): a
// balancer that keeps the address among its candidates, as with a static
// list, finds a server restarted there without sending it any call.
func (p *Pool) ReadOnly(addr string) bool {
	e := (*p.eps.Load())[addr]
	if e == nil || !e.readOnly.Load() {
		return false
	}
	e.probe()
	return e.readOnly.Load()
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
	if p.cfg.LargeMessage > 0 && p.cfg.LargeInFlight > 0 {
		e.large = make(chan struct{}, p.cfg.LargeInFlight)
	}
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

// endpoint is one address: its connection slots, dial state and read-only
// mark.
type endpoint struct {
	p        *Pool
	addr     string
	rr       atomic.Uint32 // round-robin cursor
	readOnly atomic.Bool
	// forgotten: Forget dropped the address; its connections retire.
	forgotten atomic.Bool
	slots     []atomic.Pointer[clientConn]
	large     chan struct{} // LargeInFlight slots; nil: no bound
	// largeNext is the earliest the next large request may go while small
	// calls are in flight (Pool.clock).
	largeNext atomic.Int64

	mu       sync.Mutex // guards the fields below
	dial     *dialing   // the dial in flight, if any
	failures int        // consecutive failed dials
	retryAt  time.Time  // no dial before this (backoff)
	lastErr  error      // the last dial error
}

// paced reports whether large requests are paced (Config.LargeShare).
func (p *Pool) paced() bool { return p.cfg.LargeShare > 0 && p.cfg.LargeShare < 1 }

// acquireLarge takes one of the endpoint's LargeInFlight slots, then, when
// small calls to the address are in flight, waits out the pause that
// Config.LargeShare asks for after the previous large request; both waits
// end at what is left of budget (counted from start; zero: no budget),
// ctx, or the pool's Close, as not sent. On success it returns when the
// request may go (Pool.clock), which the caller owes releaseLarge.
func (e *endpoint) acquireLarge(ctx context.Context, start time.Time, budget time.Duration) (int64, error) {
	var w largeWait
	defer w.stop()
	if e.large != nil {
		select {
		case e.large <- struct{}{}:
		default:
			if err := w.wait(ctx, e, start, budget, e.large, "waiting for a large-request slot to "); err != nil {
				return 0, err
			}
		}
	}
	if pause := time.Duration(e.largeNext.Load() - e.p.clock()); pause > 0 && e.p.paced() && e.smallInFlight() {
		w.pause = time.NewTimer(pause)
		if err := w.wait(ctx, e, start, budget, nil, "in the pause between large requests to "); err != nil {
			if e.large != nil {
				<-e.large
			}
			return 0, err
		}
	}
	return e.p.clock(), nil
}

// largeWait is acquireLarge's timers: the budget's, made on the first
// wait, and the pause's.
type largeWait struct {
	budget, pause *time.Timer
}

// wait sends on slot (nil: waits for the pause timer instead) unless the
// budget, ctx or the pool's Close comes first.
func (w *largeWait) wait(ctx context.Context, e *endpoint, start time.Time, budget time.Duration, slot chan struct{}, what string) error {
	if w.budget == nil && budget > 0 {
		w.budget = time.NewTimer(budget - time.Since(start))
	}
	var timeout, paused <-chan time.Time
	if w.budget != nil {
		timeout = w.budget.C
	}
	if w.pause != nil {
		paused = w.pause.C
	}
	select {
	case slot <- struct{}{}:
		return nil
	case <-paused:
		return nil
	case <-ctx.Done():
		return protocol.ContextError(ctx.Err(), false)
	case <-timeout:
		return protocol.NotSent(protocol.StatusClientTimeout, "timeout budget spent "+what+e.addr, nil)
	case <-e.p.ctx.Done():
		return errPoolClosed
	}
}

func (w *largeWait) stop() {
	if w.budget != nil {
		w.budget.Stop()
	}
	if w.pause != nil {
		w.pause.Stop()
	}
}

// maxLargePause bounds the pause after one large request, so that one
// that waited long (for a slow server, or until its budget ran out) does
// not hold the next ones back for several times as long.
const maxLargePause = 100 * time.Millisecond

// releaseLarge ends a large request that acquireLarge let through at
// sent: it sets when the next one may start while small calls are in
// flight, and gives back the LargeInFlight slot.
func (e *endpoint) releaseLarge(sent int64) {
	if s := e.p.cfg.LargeShare; e.p.paced() {
		now := e.p.clock()
		d := now - sent
		next := now + min(int64(float64(d)*(1-s)/s), int64(maxLargePause))
		for {
			old := e.largeNext.Load()
			if old >= next || e.largeNext.CompareAndSwap(old, next) {
				break
			}
		}
	}
	if e.large != nil {
		<-e.large
	}
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

// clock reads the monotonic clock, in nanoseconds since the pool was made.
func (p *Pool) clock() int64 { return int64(time.Since(p.epoch)) }

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

// probe dials the read-only address in the background when none of its
// connections is left (the old server closed them, or we did once they
// drained) and no dial is in flight or backing off. The new connection
// must answer a heartbeat before it is used and the read-only mark goes:
// a server still draining answers with the read-only event instead (a
// failed dial, so the next probe waits out the dial backoff), and one
// that accepted without serving does not answer at all.
func (e *endpoint) probe() {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.readOnly.Load() || e.forgotten.Load() || e.dial != nil || time.Now().Before(e.retryAt) || e.p.ctx.Err() != nil {
		return
	}
	for i := range e.slots {
		if c := e.slots[i].Load(); c != nil && !c.dead.Load() {
			return // the old server is still draining it
		}
	}
	if !e.p.goTracked() {
		return
	}
	d := &dialing{done: make(chan struct{}), probe: true}
	e.dial = d
	go e.dialSlot(0, d)
}

// errStillReadOnly is a probe's dial answered with the read-only event.
var errStillReadOnly = errors.New("transport: the address answered with the read-only event")

// verify sends a heartbeat on the freshly dialed nc and reads its answer,
// within the dial timeout, frame by frame without reading ahead (the
// connection is handed to its reader afterwards).
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

// detach empties c's slot and forgets c.
func (e *endpoint) detach(c *clientConn) {
	for i := range e.slots {
		e.slots[i].CompareAndSwap(c, nil)
	}
	e.p.forget(c)
}

// slowConn finds a connection when slot i holds none usable: it waits for
// (or starts) a dial, uses another live slot meanwhile, and fails fast
// while the address is read-only or in dial backoff.
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
	if readOnly && c != nil && !c.dead.Load() {
		// The server is draining this connection: no new calls.
		e.mu.Unlock()
		return nil, protocol.NotSent(protocol.StatusChannelInactive, "address is read-only (shutting down): "+e.addr, nil)
	}
	var other *clientConn
	if !readOnly {
		for j := range e.slots {
			if o := e.slots[j].Load(); o.usable() {
				other = o
				break
			}
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

// dialSlot dials addr for slot i and publishes the result to d.
func (e *endpoint) dialSlot(i int, d *dialing) {
	defer e.p.wg.Done()
	ctx, cancel := context.WithTimeout(e.p.ctx, e.p.cfg.DialTimeout)
	nc, err := e.p.cfg.Dial(ctx, e.addr)
	cancel()
	switch {
	case err != nil:
		err = fmt.Errorf("transport: dial %s: %w", e.addr, err)
	case d.probe:
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
		e.failures++
		delay := backoffMin << min(e.failures-1, 10)
		e.retryAt = time.Now().Add(min(delay, backoffMax))
		e.lastErr = err
	} else {
		e.failures = 0
		e.retryAt = time.Time{}
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
