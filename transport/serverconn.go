// One connection: read, dispatch, answer, heartbeat tick.

package transport

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/protocol"
)

// serverConn is one accepted connection. It has one reader goroutine,
// one coalescing writer shared by the handlers and one heartbeat timer.
type serverConn struct {
	s      *Server
	nc     net.Conn
	w      frameWriter
	nextID atomic.Uint64 // ids of the events this side sends
	live   liveness
	reply  protocol.Message // scratch for the reader's own answers
	done   chan struct{}    // closed by close
	// peer is set before the first read, after the TLS handshake if any.
	// Handler contexts point to it (RemotePeer).
	peer Peer
	// pctx is the context of calls that need no handlerCtx.
	pctx peerCtx
	// drained marks a connection accepted from the queue during Shutdown.
	// Its reader sends the read-only event before it reads anything.
	drained bool
	// announced sends the read-only event once. Shutdown or the reader
	// about to answer "shutting down" sends it, whoever comes first.
	announced sync.Once
	// wentAway queues the go-away event once: evict or turnAway, or the
	// reader about to answer a request read after the claim, whoever
	// comes first.
	wentAway sync.Once
	// placed says the connection holds one of the MaxConns places
	// (Server.nconns). The first of evict (for a connection it leaves
	// open a while) and forget to clear it gives the place back.
	placed atomic.Bool
	// placeless marks a connection turned away at MaxConns (turnAway):
	// it never held a place, and the Observer is not told of it.
	placeless bool

	// ctx ends when the connection closes; a wait for the body budget
	// ends with it.
	ctx    context.Context
	cancel context.CancelFunc
	// watch times the reads; start is when it began to.
	watch readWatch
	start time.Time

	mu     sync.Mutex // guards the fields below
	closed bool
	hb     *time.Timer
	rt     *time.Timer // runs watchReads
	lt     *time.Timer // closes a connection left open after go-away (linger)

	// accepted is when the server accepted the connection, in Unix
	// nanoseconds. At MaxConns, the oldest one without a valid frame is
	// closed first (evict).
	accepted int64
	// inflight counts the calls dispatched and not yet answered: a
	// connection with one is never evicted. evict sets it to evicting.
	inflight atomic.Int64
	// idleSince is when inflight last dropped to 0, in Unix nanoseconds;
	// 0 before the first call.
	idleSince atomic.Int64

	// callsMu guards running: the two-way calls of this connection by
	// request id, from dispatch until their handler returned. A cancel
	// event finds its call there. Ids are the client's, unique per
	// connection, so a cancel never reaches another connection's call.
	callsMu sync.Mutex
	running map[uint64]*serverCall

	// The fields below are guarded by the server's inlineWatch.mu.
	// inlineAt is the connection's place in its running list, or -1.
	inlineAt int
	// inlineRun counts the calls the reader ran; inlineSeen is the count
	// at the watch's last look.
	inlineRun, inlineSeen uint64
	// inlineState is the reader's, handed on with the reading.
	inlineState *readState
}

// newServerConn wraps an accepted connection, in TLS when the server has a
// TLS config. It starts no goroutine and does no I/O.
func newServerConn(s *Server, nc net.Conn) *serverConn {
	if s.cfg.TLS != nil {
		nc = tls.Server(nc, s.cfg.TLS)
	}
	sc := &serverConn{s: s, nc: nc, done: make(chan struct{}), running: make(map[uint64]*serverCall)}
	sc.peer = Peer{RemoteAddr: nc.RemoteAddr(), LocalAddr: nc.LocalAddr()}
	sc.accepted = time.Now().UnixNano()
	sc.ctx, sc.cancel = context.WithCancel(s.base)
	sc.pctx = peerCtx{Context: s.base, peer: &sc.peer}
	sc.w.init(nc, func(err error) {
		s.log.Debug("transport: write failed; closing connection", "remote", nc.RemoteAddr(), "err", err)
		sc.close()
	})
	return sc
}

// close closes the connection and cancels its running calls, once.
func (sc *serverConn) close() {
	sc.mu.Lock()
	if sc.closed {
		sc.mu.Unlock()
		return
	}
	sc.closed = true
	if sc.hb != nil {
		sc.hb.Stop()
		sc.hb = nil
	}
	if sc.rt != nil {
		sc.rt.Stop()
		sc.rt = nil
	}
	lingered := sc.lt != nil
	if lingered {
		sc.lt.Stop()
		sc.lt = nil
	}
	sc.mu.Unlock()
	if lingered {
		sc.s.lingering.Add(-1)
	}
	sc.w.fail(ErrServerClosed)
	_ = sc.nc.Close()
	sc.cancel()
	// The callers of the running calls are gone with the connection.
	// Cancel the calls, as if each caller had sent the cancel event.
	sc.callsMu.Lock()
	for _, call := range sc.running {
		call.cancelled.Store(true)
		call.ctx.cancel(context.Canceled)
	}
	sc.callsMu.Unlock()
	sc.s.forget(sc)
	close(sc.done)
}

// tick runs once per heartbeat interval (see clientConn.tick).
func (sc *serverConn) tick() {
	sc.mu.Lock()
	if sc.hb == nil {
		sc.mu.Unlock()
		return
	}
	sc.hb.Reset(sc.s.cfg.HeartbeatInterval)
	sc.mu.Unlock()
	switch sc.live.tick(sc.w.state()) {
	case tickHeartbeat:
		_ = sc.w.writeEvent(eventHeartbeat, sc.nextID.Add(1))
	case tickSilent:
		sc.s.log.Info("transport: client silent; closing connection", "remote", sc.nc.RemoteAddr(),
			"intervals", silentTicks)
		sc.close()
	case tickStalled:
		sc.s.log.Info("transport: write stalled; closing connection", "remote", sc.nc.RemoteAddr())
		sc.close()
	}
}

// serverCall is one request on its way through a handler. It is pooled
// with its request and response messages.
type serverCall struct {
	sc   *serverConn
	req  protocol.Message
	resp protocol.Message
	// ctx is the handler's context for a two-way request or one with a
	// budget. Other requests get the connection's pctx. It is new for
	// every call: a handler may keep it (context.WithoutCancel, work that
	// goes on), and it must keep answering for its own request.
	ctx *handlerCtx
	// cancelled is set, under sc.callsMu, when the client sent the cancel
	// event for this call or the connection closed.
	cancelled atomic.Bool
}

var serverCallPool = sync.Pool{New: func() any { return new(serverCall) }}

// putServerCall recycles call's messages and returns it to the pool.
func putServerCall(call *serverCall) {
	call.sc = nil
	payload := call.resp.Payload[:0] // the next handler encodes into it
	if sameArray(payload, call.req.Payload) {
		// The handler answered with (part of) the request's own body.
		// That array is the request's and is recycled with it. Kept here
		// too, the next read would write under the next handler's
		// encoding, or a large array would go back to the pool twice.
		payload = nil
	}
	call.req.Recycle()
	if cap(payload) > bufpool.MaxKept {
		// A large response, often out of the shared pool, has been
		// written. Hand it back rather than keep it.
		bufpool.Put(payload)
		payload = nil
	}
	call.resp.Reset()
	call.resp.Payload = payload
	call.ctx = nil
	call.cancelled.Store(false)
	serverCallPool.Put(call)
}

// sameArray reports whether a and b are slices of one array.
// Their capacities then end at the same byte.
func sameArray(a, b []byte) bool {
	return cap(a) > 0 && cap(b) > 0 && &a[:cap(a)][cap(a)-1] == &b[:cap(b)][cap(b)-1]
}

// skipBody drops the body of a frame whose header claimed more than
// MaxBody, and answers a two-way request with status 40. It reports false
// when the connection must close: a claim over maxSkipped, or a body that
// could not be read.
func (sc *serverConn) skipBody(br *bufio.Reader, req *protocol.Message, tooLarge error) bool {
	// The connection stays. The other calls on it, and the instance's
	// standing with its clients' breakers, do not suffer for one request.
	n := req.Header.BodyLen()
	if n > maxSkipped {
		return false
	}
	if _, err := br.Discard(int(n)); err != nil {
		return false
	}
	f := req.Header.Flags()
	sc.s.log.Info("transport: request body over MaxBody; dropped it", "remote", sc.nc.RemoteAddr(), "err", tooLarge)
	if f.IsRequest() && !f.IsEvent() {
		sc.s.rejected(RejectBadRequest)
		if f.IsTwoWay() {
			sc.answer(req, protocol.StatusBadRequest, []byte(tooLarge.Error()))
		}
	}
	return true
}

// logReadError logs why the reader stopped, at a level fit for the cause.
func (sc *serverConn) logReadError(err error) {
	remote := sc.nc.RemoteAddr()
	switch {
	case errors.Is(err, io.EOF), errors.Is(err, net.ErrClosed):
		sc.s.log.Debug("transport: connection closed", "remote", remote, "err", err)
	case errors.Is(err, protocol.ErrBadMagic), errors.Is(err, protocol.ErrBodyTooLarge):
		sc.s.log.Info("transport: bad frame; closing connection", "remote", remote, "err", err)
	default:
		sc.s.log.Debug("transport: read failed; closing connection", "remote", remote, "err", err)
	}
}

// dispatch hands one request to a worker, or answers it at once when it
// cannot run. It reports true, having handed it to no one, when the reader
// should run the call itself: mayInline is set and nothing else of the
// connection is in flight.
func (sc *serverConn) dispatch(call *serverCall, mayInline bool) (inline bool) {
	s := sc.s
	n := sc.inflight.Add(1)
	if n < 0 {
		// The connection went away: evict chose it to make room, or it
		// was turned away at accept. The request is not run: it is
		// answered 100 behind the go-away event, so its caller knows it
		// is safe to send again elsewhere.
		sc.goAway()
		s.rejected(RejectGoneAway)
		if call.req.Header.Flags().IsTwoWay() {
			sc.answer(&call.req, protocol.StatusServerThreadpoolExhausted, msgGoneAway)
		}
		putServerCall(call)
		return false
	}
	req := &call.req
	twoWay := req.Header.Flags().IsTwoWay()
	var status protocol.Status
	var msg []byte
	var reason Rejection
	switch {
	case s.current() != serving:
		status, msg, reason = protocol.StatusServerThreadpoolExhausted, msgShuttingDown, RejectShutdown
	case req.Timeout < 0:
		status, msg, reason = protocol.StatusServerTimeout, msgBudgetSpent, RejectBudgetSpent
	case s.slots.Add(1) > int64(s.cfg.MaxConcurrent):
		s.slots.Add(-1)
		status, msg, reason = protocol.StatusServerThreadpoolExhausted, msgBusy, RejectOverload
	default:
		// Count the call, then look again: Shutdown stores draining, then
		// reads active. So either it sees this call or the call sees it.
		if s.active.Add(1); s.current() != serving {
			s.slots.Add(-1)
			s.release()
			status, msg, reason = protocol.StatusServerThreadpoolExhausted, msgShuttingDown, RejectShutdown
		}
	}
	if status != 0 {
		s.rejected(reason)
		if twoWay {
			if status == protocol.StatusServerThreadpoolExhausted && s.current() != serving {
				sc.announce() // the client learns why before it sees the 100
			}
			sc.answer(req, status, msg)
		}
		sc.callDone()
		putServerCall(call)
		return false
	}
	call.sc = sc
	if twoWay || req.Timeout > 0 {
		var deadline time.Time
		if req.Timeout > 0 {
			deadline = time.Now().Add(req.Timeout)
		}
		call.ctx = newHandlerCtx(s.base, deadline, req, &sc.peer)
	}
	if twoWay {
		// Tracked here, on the reader goroutine, so a cancel read after
		// this request always finds it.
		sc.callsMu.Lock()
		sc.running[req.Header.ID()] = call
		sc.callsMu.Unlock()
	}
	if n == 1 && mayInline && !s.cfg.noInline {
		return true
	}
	s.workers.handOff(call)
	return false
}

// goAway queues the go-away event on this connection, once. It never
// waits on the socket: evict calls it from the accept loop.
func (sc *serverConn) goAway() {
	sc.wentAway.Do(func() {
		if sc.w.queueEvent(eventGoAway, sc.nextID.Add(1)) {
			go func() { _ = sc.w.flush() }() // a failed write closes the connection itself
		}
	})
}

// linger closes the connection after d, unless it closes before, and
// counts it in the server's lingering until then. It reports false,
// arming nothing, when the connection is closed or lingers already, or
// when maxLingering connections linger.
func (sc *serverConn) linger(d time.Duration) bool {
	s := sc.s
	sc.mu.Lock()
	defer sc.mu.Unlock()
	if sc.closed || sc.lt != nil {
		return false
	}
	if s.lingering.Add(1) > maxLingering {
		s.lingering.Add(-1)
		return false
	}
	sc.lt = time.AfterFunc(d, sc.close)
	return true
}

// announce sends the read-only event on this connection, once.
func (sc *serverConn) announce() {
	sc.announced.Do(func() { _ = sc.w.writeEvent(eventReadOnly, sc.nextID.Add(1)) })
}

// answer writes a response the reader makes itself, with status and msg.
func (sc *serverConn) answer(req *protocol.Message, status protocol.Status, msg []byte) {
	m := &sc.reply
	m.Header.Init(protocol.MakeFlags(0, req.Header.Flags().Serialization()), status, req.Header.ID())
	m.Payload = msg
	_, _ = sc.w.writeMessage(m, limit{})
	m.Payload = nil
}

// answerForeign answers a request in a serialization the server does not
// read with status 40, in words its peer can read. The peer is logged once
// a minute.
func (sc *serverConn) answerForeign(req *protocol.Message) {
	f := req.Header.Flags()
	if !f.IsRequest() {
		return // a stray response: nothing waits for it
	}
	sc.s.rejected(RejectBadRequest)
	id := f.Serialization()
	name := protocol.SerializationName(id)
	sc.s.logPeer(sc.nc.RemoteAddr(), "transport: a request in a serialization this server does not read; answered 40",
		"serialization", name, "id", id)
	if !f.IsTwoWay() {
		return
	}
	msg := fmt.Sprintf("this is a dabb server; it does not read serialization %s (id %d)", name, id)
	_ = sc.w.writeFrame(protocol.AppendForeignError(nil, req.Header.ID(), id, protocol.StatusBadRequest, msg))
}

// cancelCall cancels the handler context of this connection's two-way
// call with the given id, after the client's cancel event. It ignores an
// unknown id: that call has finished.
func (sc *serverConn) cancelCall(id uint64) {
	sc.callsMu.Lock()
	defer sc.callsMu.Unlock()
	if call := sc.running[id]; call != nil {
		call.cancelled.Store(true)
		call.ctx.cancel(context.Canceled)
	}
}

// run runs the handler and writes its response. It holds a MaxConcurrent
// slot until the handler has returned. A call the client cancelled
// before it started does not run.
func (call *serverCall) run() {
	// Deferred, so a handler that ends its goroutine (runtime.Goexit, as
	// t.FailNow does) still gets its answer written and its slot back.
	defer call.finish()
	call.handle()
}

// runInline runs the call on its reader, as run does, and returns how long
// its handler took. slow reports that it took longer than quick while
// frames of its connection waited behind it: behind says some were read
// with it, and rc is its socket (nil: not looked at, counted as waiting).
func (call *serverCall) runInline(quick time.Duration, behind bool, rc syscall.RawConn) (took time.Duration, slow bool) {
	defer call.finish()
	start := time.Now()
	call.handle()
	took = time.Since(start)
	// The socket is looked at before the answer leaves: bytes that come
	// after it may be the caller's next request, which waited for no one.
	return took, took > quick && (behind || socketPending(rc))
}

// handle calls the handler with the call's context.
func (call *serverCall) handle() {
	s := call.sc.s
	req := &call.req
	if req.Header.Flags().IsTwoWay() || req.Timeout > 0 {
		if !call.cancelled.Load() {
			s.invoke(call.ctx, req, &call.resp)
		}
	} else {
		s.invoke(&call.sc.pctx, req, &call.resp)
	}
}

// finish ends a call after its handler. It writes the response, releases
// the MaxConcurrent slot and pools the call.
func (call *serverCall) finish() {
	sc := call.sc
	s := sc.s
	req, resp := &call.req, &call.resp
	twoWay := req.Header.Flags().IsTwoWay()
	expired := false
	if ctx := call.ctx; twoWay || req.Timeout > 0 {
		expired = !ctx.deadline.IsZero() && !time.Now().Before(ctx.deadline)
		if twoWay {
			sc.callsMu.Lock()
			if sc.running[req.Header.ID()] == call {
				delete(sc.running, req.Header.ID())
			}
			sc.callsMu.Unlock()
		}
		ctx.cancel(context.Canceled)
		ctx.req.Store(nil) // the message is pooled below: Request answers nil from now on
	}
	// Before the answer: a caller that sends its next request as soon as
	// it has this answer must not find this call still counted.
	s.slots.Add(-1)
	// No response goes to a caller that sent the cancel event. Nor does
	// one go to a caller whose budget ran out while the handler ran. Its
	// deadline was no later than ours, so it has reported a timeout (31,
	// "the server may have acted"). An answer racing that report would
	// make the outcome depend on which timer fired first.
	if twoWay && !call.cancelled.Load() && !expired {
		status := resp.Header.Status()
		if status == 0 {
			status = protocol.StatusOK
		}
		resp.Header.Init(protocol.MakeFlags(0, req.Header.Flags().Serialization()), status, req.Header.ID())
		resp.Service, resp.Method, resp.Timeout = "", "", 0
		if n := protocol.BodyLen(resp); uint64(n) > uint64(s.cfg.MaxBody) {
			// The client would drop it. With an older or smaller limit it
			// would close the connection under every call on it.
			s.log.Warn("transport: response over MaxBody; answering 50 instead",
				"service", req.Service, "method", req.Method, "bytes", n, "max_body", s.cfg.MaxBody)
			resp.Header.SetStatus(protocol.StatusBadResponse)
			resp.Attachments, resp.IdempotencyKey = nil, ""
			resp.Payload = fmt.Appendf(resp.Payload[:0], "response of %d bytes is over the server's MaxBody (%d)", n, s.cfg.MaxBody)
		} else if err := protocol.CheckAttachments(resp); err != nil {
			// The client would refuse the frame as malformed and close
			// the connection under every call on it.
			s.log.Warn("transport: response with too many attachments; answering 50 instead",
				"service", req.Service, "method", req.Method, "err", err)
			resp.Header.SetStatus(protocol.StatusBadResponse)
			resp.Attachments, resp.IdempotencyKey = nil, ""
			resp.Payload = fmt.Appendf(resp.Payload[:0], "response not sent: %v", err)
		}
		// A large response waits for the socket at most until the
		// request's deadline: its caller has given up by then. A client
		// that stopped reading must not pile up payloads here.
		if _, err := sc.w.writeMessage(resp, limit{deadline: call.ctx.deadline}); errors.Is(err, errBackedUp) {
			s.log.Warn("transport: client not reading its responses; closing the connection",
				"remote", sc.nc.RemoteAddr(), "err", err)
			sc.close()
		}
	}
	sc.callDone()
	s.release()
	putServerCall(call)
}

// callDone ends a call counted by inflight, answered or refused.
func (sc *serverConn) callDone() {
	if sc.inflight.Add(-1) == 0 {
		sc.idleSince.Store(time.Now().UnixNano())
	}
}

// invoke calls the handler. A panic, or a handler that ends its goroutine
// with runtime.Goexit, becomes status 70 for this call.
func (s *Server) invoke(ctx context.Context, req, resp *protocol.Message) {
	returned := false
	defer func() {
		v := recover()
		if v == nil && returned {
			return
		}
		// The panic's text stays in the server's log: it may hold what the
		// caller must not see. The id ties the caller's error to the line.
		id := fmt.Sprintf("%016x", rand.Uint64())
		msg := "handler panic (id " + id + ")"
		if v == nil {
			msg = "handler exited its goroutine (runtime.Goexit) without returning (id " + id + ")"
			s.log.Error("transport: "+msg, "service", req.Service, "method", req.Method, "id", id)
		} else {
			s.log.Error("transport: handler panic", "service", req.Service, "method", req.Method,
				"id", id, "panic", v, "stack", string(debug.Stack()))
		}
		resp.Reset()
		resp.Header.SetStatus(protocol.StatusServiceError)
		resp.Payload = append(resp.Payload, msg...)
	}()
	s.h.ServeRPC(ctx, req, resp)
	returned = true
}
