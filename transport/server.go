package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/protocol"
)

// Handler serves one request. It fills resp: its status
// (resp.Header.SetStatus; zero means OK), Payload and Attachments. The
// transport sets resp's magic, id and flags (a response with the request's
// serialization id) and encodes it after ServeRPC returns, then reuses both
// messages: neither may be kept after ServeRPC returns.
//
// resp.Payload arrives empty but with the capacity of an earlier response,
// so that encoding into it allocates nothing: append to it
// (resp.Payload = append(resp.Payload[:0], ...)). The transport reuses
// whatever resp.Payload holds once the response is written, so a handler
// that assigns a slice of its own must not touch that slice again. Echoing
// the request (resp.Payload = req.Payload) is fine: that array stays the
// request's.
//
// ctx carries the request's deadline when it came with a budget, and is
// cancelled when the server is closed, and, for a two-way request, when
// the client sends the cancel event for it or its connection closes: the
// caller gave up, or is gone. Either
// way ctx.Err() is then context.Canceled. The response of a call the
// client cancelled is not sent, since nobody waits for it; nor is the
// response of a call whose budget ran out before the handler returned:
// the caller's deadline was no later, so it has given up. A handler must
// return once ctx is done. Like the messages, ctx must not be used after
// ServeRPC returns: the server reuses it.
type Handler interface {
	ServeRPC(ctx context.Context, req, resp *protocol.Message)
}

// HandlerFunc adapts a function to a Handler.
type HandlerFunc func(ctx context.Context, req, resp *protocol.Message)

// ServeRPC calls f(ctx, req, resp).
func (f HandlerFunc) ServeRPC(ctx context.Context, req, resp *protocol.Message) { f(ctx, req, resp) }

var _ Handler = HandlerFunc(nil)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("transport: server closed")

// ServerConfig configures a Server. The zero value works.
type ServerConfig struct {
	// MaxConcurrent bounds the requests running at once across the
	// server; a request over it is answered with status 100 at once,
	// never queued. Default 10000.
	MaxConcurrent int
	// MaxBody limits a request's body. A larger request is read and
	// dropped and answered with status 40 (the connection stays), unless
	// it claims more than 64 MiB, which closes the connection. It bounds
	// responses too: a handler's answer over it is replaced by status 50
	// (bad response) saying so, as Apache Dubbo's payload limit does.
	// Default protocol.DefaultMaxBody.
	MaxBody uint32
	// HeartbeatInterval: a connection that read nothing for this long
	// sends a heartbeat; one silent for 3 intervals is closed.
	// Default 60s.
	HeartbeatInterval time.Duration
	// ShutdownLinger is how long Shutdown waits, after the last handler,
	// for clients to close their connections after the read-only event;
	// peers that do not understand the event are closed when it runs out.
	// Meanwhile every request that arrives is answered at once with status
	// 100, not run. A dabb Pool closes a connection as soon as its last
	// call is answered, so Shutdown rarely waits this long. A peer that
	// ignores the event can lose a request it writes after the server's
	// last read: it sees the connection close with no answer, although
	// nothing ran. Default 2s.
	ShutdownLinger time.Duration
	// WaitForHandlers makes Close, and a Shutdown whose ctx ends first,
	// wait for the running handlers to return (their contexts are
	// cancelled). By default they return as soon as the connections are
	// closed, as net/http's Shutdown and gRPC's Stop do: a handler that
	// ignores its context cannot hold the process up, and runs on until
	// it returns, its answer going nowhere.
	WaitForHandlers bool
	// Logger receives connection events and handler panics. Nil means
	// slog.Default().
	Logger *slog.Logger
}

// Messages of the statuses the server makes itself.
var (
	msgShuttingDown = []byte("server shutting down")
	msgBusy         = []byte("server busy: too many concurrent requests")
	msgBudgetSpent  = []byte("timeout budget spent before the handler ran")
)

// Server serves requests on any number of listeners. Create it with
// NewServer.
type Server struct {
	h      Handler
	cfg    ServerConfig
	log    *slog.Logger
	base   context.Context // parent of every handler's ctx
	cancel context.CancelFunc

	// slots counts the requests holding a MaxConcurrent slot: taken in
	// dispatch, given back before the response is written, so a caller
	// that sends its next request as soon as it has the answer never
	// finds its own finished call still counted.
	slots atomic.Int64
	// active counts the requests from dispatch until their response was
	// handed to the writer; Shutdown waits for it to reach 0.
	active   atomic.Int64
	shutting atomic.Bool   // Shutdown or Close began
	idle     chan struct{} // signalled when active drops to 0 while shutting
	quit     chan struct{} // closed when Shutdown or Close begins
	wg       sync.WaitGroup

	workersMu     sync.Mutex    // guards the fields below
	idleWorkers   []*idleWorker // a stack: the most recently idle on top
	workersClosed bool          // Close began: workers exit instead of idling
	reapGen       uint64        // reaps so far
	reaper        *time.Timer   // retires long-idle workers; nil when none idle

	mu        sync.Mutex // guards the fields below
	closed    bool
	listeners map[net.Listener]*listenerState
	hard      bool           // Close (or Shutdown's deadline) began: drain nothing more
	drains    sync.WaitGroup // Serve loops draining their accept queue for Shutdown
	conns     map[*serverConn]struct{}
}

// NewServer returns a Server that serves requests with h (nil answers every
// request with status 60). It does no I/O.
func NewServer(h Handler, cfg ServerConfig) *Server {
	if h == nil {
		h = HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
			resp.Header.SetStatus(protocol.StatusServiceNotFound)
			resp.Payload = append(resp.Payload[:0], "transport: no handler"...)
		})
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 10000
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = protocol.DefaultMaxBody
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 60 * time.Second
	}
	if cfg.ShutdownLinger <= 0 {
		cfg.ShutdownLinger = 2 * time.Second
	}
	s := &Server{
		h:         h,
		cfg:       cfg,
		log:       cfg.Logger,
		idle:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
		listeners: make(map[net.Listener]*listenerState),
		conns:     make(map[*serverConn]struct{}),
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	return s
}

// Serve accepts connections on l and serves them until Shutdown or Close,
// then returns ErrServerClosed. Temporary accept errors are retried after
// a short backoff. Serve closes l when it returns.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = l.Close()
		return ErrServerClosed
	}
	st := &listenerState{}
	s.listeners[l] = st
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if st.drain {
			st.drain = false
			s.drains.Done()
		}
		delete(s.listeners, l)
		s.mu.Unlock()
		_ = l.Close()
	}()

	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.shutting.Load() {
				s.drainQueue(l, st)
				return ErrServerClosed
			}
			if errors.Is(err, net.ErrClosed) {
				return fmt.Errorf("transport: accept: %w", err)
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			s.log.Warn("transport: accept failed; retrying", "err", err, "delay", delay)
			t := time.NewTimer(delay)
			select {
			case <-t.C:
			case <-s.quit:
				t.Stop()
				s.drainQueue(l, st)
				return ErrServerClosed
			}
			continue
		}
		delay = 0
		sc := newServerConn(s, nc)
		if !s.track(sc, false) {
			// Shutdown began after this Accept: serve the connection
			// as one from the queue, or close it if the server is
			// closed for good.
			sc.drained = true
			if !s.track(sc, true) {
				_ = nc.Close()
				return ErrServerClosed
			}
			go sc.serve()
			s.drainQueue(l, st)
			return ErrServerClosed
		}
		go sc.serve()
	}
}

// listenerState is what Shutdown asks of one Serve loop.
type listenerState struct {
	// drain: the loop accepts what is queued before it closes its
	// listener (counted in Server.drains until it has).
	drain bool
}

// deadliner is a listener whose Accept can be given a deadline
// (*net.TCPListener, *net.UnixListener).
type deadliner interface{ SetDeadline(time.Time) error }

// queueDrainWindow is how long a draining listener waits for a further
// queued connection after the last one.
const queueDrainWindow = 10 * time.Millisecond

// drainQueue accepts the connections that completed their handshake
// before Shutdown, if Shutdown asked this loop to (st.drain), and serves
// them like every other connection during Shutdown: they get the read-only
// event, and their requests status 100, "not run, safe to retry". Closing
// a listener instead makes the operating system reset them, and a client
// that has already sent on one cannot tell that nothing ran.
func (s *Server) drainQueue(l net.Listener, st *listenerState) {
	s.mu.Lock()
	drain := st.drain
	s.mu.Unlock()
	if !drain {
		return
	}
	defer func() {
		s.mu.Lock()
		if st.drain {
			st.drain = false
			s.drains.Done()
		}
		s.mu.Unlock()
	}()
	dl, ok := l.(deadliner)
	if !ok {
		return
	}
	for {
		_ = dl.SetDeadline(time.Now().Add(queueDrainWindow))
		nc, err := l.Accept()
		if err != nil {
			return // the window passed with nothing queued, or Close
		}
		sc := newServerConn(s, nc)
		sc.drained = true
		if !s.track(sc, true) {
			_ = nc.Close()
			return
		}
		go sc.serve()
	}
}

// track registers a connection and counts its goroutine; false once the
// server is closing, or, for a connection drained from an accept queue
// during Shutdown (draining), once it is closed for good.
func (s *Server) track(sc *serverConn, draining bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.hard || (s.closed && !draining) {
		return false
	}
	s.conns[sc] = struct{}{}
	s.wg.Add(1)
	return true
}

func (s *Server) forget(sc *serverConn) {
	s.mu.Lock()
	delete(s.conns, sc)
	s.mu.Unlock()
}

// stop marks the server closing and returns the open connections; it
// reports false when it was already closing. graceful (Shutdown) asks each
// Serve loop whose listener takes a deadline to accept what is queued
// before it closes the listener (drainQueue; Shutdown waits for s.drains);
// otherwise, and for other listeners, the listeners are closed now.
func (s *Server) stop(graceful bool) ([]*serverConn, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	first := !s.closed
	if first {
		s.closed = true
		s.shutting.Store(true)
		close(s.quit)
	}
	if !graceful {
		s.hard = true
	}
	for l, st := range s.listeners {
		if graceful && st.drain {
			continue // a first Shutdown's drain owns it and closes it
		}
		if dl, ok := l.(deadliner); ok && graceful && first {
			st.drain = true
			s.drains.Add(1)
			_ = dl.SetDeadline(time.Now()) // wakes the loop's Accept
			continue
		}
		_ = l.Close()
	}
	return s.openConnsLocked(), first
}

// openConns returns the connections being served.
func (s *Server) openConns() []*serverConn {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.openConnsLocked()
}

func (s *Server) openConnsLocked() []*serverConn {
	conns := make([]*serverConn, 0, len(s.conns))
	for sc := range s.conns {
		conns = append(conns, sc)
	}
	return conns
}

// Shutdown stops the server gracefully: it stops accepting, sends the
// read-only event on every open connection, answers requests arriving from
// then on with status 100 "server shutting down" (rejected, not run: safe
// to retry), and waits for running handlers to finish and their responses
// to be written. It then lingers: it keeps reading (and rejecting) until
// each client has closed its connection, which a dabb Pool does once its
// last call on it is answered, for at most ServerConfig.ShutdownLinger,
// and closes whatever is left. So no request a dabb client sent on a
// connection being served goes unanswered. A peer that ignores the
// read-only event is closed when the linger runs out; a request it wrote
// after the server's last read is lost without an answer (it was not run,
// but that peer cannot know). Connections still in a listener's accept
// queue when Shutdown begins are accepted and served the same way before
// the listener closes (for listeners with SetDeadline, as TCP and Unix
// listeners have), rather than left to the operating system, which would
// reset them under a client that may already have sent its request.
//
// If ctx ends first, Shutdown cancels the handlers' contexts, closes
// everything and returns ctx.Err() (after the handlers returned, with
// ServerConfig.WaitForHandlers).
func (s *Server) Shutdown(ctx context.Context) error {
	_, first := s.stop(true)
	// Announce read-only on every connection at once: from now on
	// requests are answered "shutting down" (100), and a client must
	// know why before it sees one, or it takes them for an overloaded
	// instance (its breaker would open on a server about to be
	// restarted). A write can block on a full socket, so each runs on
	// its own goroutine; closing the connections releases any that is
	// stuck, and Shutdown waits for them all. Connections still queued
	// in the listeners are accepted meanwhile and announce themselves.
	var events sync.WaitGroup
	if first {
		for _, sc := range s.openConns() {
			events.Go(sc.announce)
		}
	}
	sent := make(chan struct{})
	go func() { events.Wait(); close(sent) }()
	defer func() { <-sent }()
	drained := make(chan struct{})
	go func() { s.drains.Wait(); close(drained) }()
	for _, ch := range []chan struct{}{sent, drained} {
		select {
		case <-ch:
		case <-ctx.Done():
			s.closeAll(s.cfg.WaitForHandlers)
			return ctx.Err()
		}
	}
	conns := s.openConns()

	for s.active.Load() != 0 {
		select {
		case <-s.idle:
			// release signals once; pass it on to any other Shutdown
			// waiting here.
			if s.active.Load() == 0 {
				select {
				case s.idle <- struct{}{}:
				default:
				}
			}
		case <-ctx.Done():
			s.closeAll(s.cfg.WaitForHandlers)
			return ctx.Err()
		}
	}
	// Handlers are done; wait until their responses left the writers.
	// Polled, like net/http's Shutdown: it is short and happens once.
	poll := time.Millisecond
	for _, sc := range conns {
		for !sc.w.idle() {
			t := time.NewTimer(poll)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				s.closeAll(s.cfg.WaitForHandlers)
				return ctx.Err()
			}
			poll = min(2*poll, 20*time.Millisecond)
		}
	}
	err := s.linger(ctx, conns)
	s.closeAll(true) // the handlers are done: only the readers are left to end
	return err
}

// linger waits until the peers closed conns, or ShutdownLinger has passed
// (nil), or ctx is done (its error). Each connection's done channel closes
// when its reader sees the peer go, and the connection is forgotten then.
func (s *Server) linger(ctx context.Context, conns []*serverConn) error {
	t := time.NewTimer(s.cfg.ShutdownLinger)
	defer t.Stop()
	for i, sc := range conns {
		select {
		case <-sc.done:
		case <-t.C:
			open := 0
			for _, sc := range conns[i:] {
				select {
				case <-sc.done:
				default:
					open++
				}
			}
			s.log.Info("transport: shutdown linger over; closing connections whose peers did not close them",
				"connections", open, "linger", s.cfg.ShutdownLinger)
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Close closes the server at once: listeners, connections and handler
// contexts. With ServerConfig.WaitForHandlers it waits for the handlers to
// return.
func (s *Server) Close() error {
	s.stop(false)
	s.closeAll(s.cfg.WaitForHandlers)
	return nil
}

// closeAll closes the connections first, so no handler answers once Close
// was called, then cancels the handlers' contexts; with wait, it waits for
// the server's goroutines (readers, workers and the handlers they run).
func (s *Server) closeAll(wait bool) {
	conns, _ := s.stop(false) // also catches connections tracked meanwhile
	for _, sc := range conns {
		sc.close()
	}
	s.cancel()
	s.closeWorkers()
	if wait {
		s.wg.Wait()
	}
}

// release ends a request counted by active.
func (s *Server) release() {
	if s.active.Add(-1) == 0 && s.shutting.Load() {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}

// serverConn is one accepted connection: one reader goroutine, the
// coalescing writer shared by the handlers, one heartbeat timer.
type serverConn struct {
	s      *Server
	nc     net.Conn
	w      frameWriter
	nextID atomic.Uint64 // ids of the events this side sends
	live   liveness
	reply  protocol.Message // scratch for the reader's own answers
	done   chan struct{}    // closed by close
	// drained: accepted during Shutdown (from the accept queue); its
	// reader sends the read-only event before it reads anything.
	drained bool
	// announced sends the read-only event once, whoever comes first:
	// Shutdown, or the reader about to answer a request with "shutting
	// down". Once.Do returns only after the event is in the writer, so
	// no such answer reaches the client before it.
	announced sync.Once

	mu     sync.Mutex // guards the fields below
	closed bool
	hb     *time.Timer

	// callsMu guards running: the two-way calls of this connection from
	// dispatch until their handler returned, by request id, so a cancel
	// event finds the handler's context. Ids are the client's, unique per
	// connection, so a cancel never reaches another connection's call.
	callsMu sync.Mutex
	running map[uint64]*serverCall
}

func newServerConn(s *Server, nc net.Conn) *serverConn {
	sc := &serverConn{s: s, nc: nc, done: make(chan struct{}), running: make(map[uint64]*serverCall)}
	sc.w.init(nc, func(err error) {
		s.log.Debug("transport: write failed; closing connection", "remote", nc.RemoteAddr(), "err", err)
		sc.close()
	})
	return sc
}

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
	sc.mu.Unlock()
	sc.w.fail(ErrServerClosed)
	_ = sc.nc.Close()
	// The callers of the calls still running are gone with the
	// connection: cancel them, as if each had sent the cancel event.
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

// serverCall is one request on its way through a handler, pooled with its
// request and response messages and its handler context.
type serverCall struct {
	sc   *serverConn
	req  protocol.Message
	resp protocol.Message
	// ctx is the handler's context for a two-way request or one with a
	// budget (others get the server's base context); new for every call,
	// since a handler may keep it (context.WithoutCancel, a goroutine
	// started for write-behind work) and it must stay cancelled and keep
	// answering for its own request.
	ctx *handlerCtx
	// cancelled is set, under sc.callsMu, when the client sent the cancel
	// event for this call.
	cancelled atomic.Bool
}

var serverCallPool = sync.Pool{New: func() any { return new(serverCall) }}

func putServerCall(call *serverCall) {
	call.sc = nil
	payload := call.resp.Payload[:0] // the next handler encodes into it
	if sameArray(payload, call.req.Payload) {
		// The handler answered with (part of) the request's own body:
		// that array is the request's, recycled with it. Kept here too,
		// the next read would write under the next handler's encoding,
		// or a large one would go back to the pool twice.
		payload = nil
	}
	call.req.Recycle()
	if cap(payload) > bufpool.MaxKept {
		// A large response (from the codec, often out of the shared
		// pool) has been written: hand it back rather than keep it.
		bufpool.Put(payload)
		payload = nil
	}
	call.resp.Reset()
	call.resp.Payload = payload
	call.ctx = nil
	call.cancelled.Store(false)
	serverCallPool.Put(call)
}

// sameArray reports whether a and b are slices of one array (their
// capacities end at the same byte).
func sameArray(a, b []byte) bool {
	return cap(a) > 0 && cap(b) > 0 && &a[:cap(a)][cap(a)-1] == &b[:cap(b)][cap(b)-1]
}

// serve is the connection's reader goroutine.
func (sc *serverConn) serve() {
	s := sc.s
	defer s.wg.Done()
	defer sc.close()
	sc.mu.Lock()
	if !sc.closed {
		sc.hb = time.AfterFunc(s.cfg.HeartbeatInterval, sc.tick)
	}
	sc.mu.Unlock()

	if sc.drained {
		sc.announce()
	}
	br := bufio.NewReaderSize(sc.live.source(sc.nc), readBufferSize)
	rd := protocol.NewReader(br, s.cfg.MaxBody)
	for {
		call := serverCallPool.Get().(*serverCall)
		err := rd.Read(&call.req)
		if err != nil {
			if errors.Is(err, protocol.ErrMalformed) {
				// The frame was consumed whole: answer it and go on.
				if call.req.Header.Flags().IsTwoWay() {
					sc.answer(&call.req, protocol.StatusBadRequest, []byte(err.Error()))
				}
				putServerCall(call)
				continue
			}
			if errors.Is(err, protocol.ErrBodyTooLarge) && sc.skipBody(br, &call.req, err) {
				putServerCall(call)
				continue
			}
			putServerCall(call)
			sc.logReadError(err)
			return
		}
		req := &call.req
		f := req.Header.Flags()
		switch {
		case f.IsEvent():
			switch {
			case req.IsHeartbeat():
				_ = sc.w.writeEvent(eventHeartbeatResponse, req.Header.ID())
			case req.IsCancel():
				sc.cancelCall(req.Header.ID())
			}
			putServerCall(call)
		case !f.IsRequest():
			putServerCall(call) // a stray response: nothing waits for it
		default:
			sc.dispatch(call)
		}
	}
}

// skipBody drops the body of a frame whose header said it was larger than
// MaxBody and answers a two-way request with status 40, keeping the
// connection: the other calls on it, and the instance's standing with its
// clients' breakers, do not suffer for one oversized request. It reports
// false when the connection must close: a claim over maxSkipped, or the
// body could not be read.
func (sc *serverConn) skipBody(br *bufio.Reader, req *protocol.Message, tooLarge error) bool {
	n := req.Header.BodyLen()
	if n > maxSkipped {
		return false
	}
	if _, err := br.Discard(int(n)); err != nil {
		return false
	}
	f := req.Header.Flags()
	sc.s.log.Info("transport: request body over MaxBody; dropped it", "remote", sc.nc.RemoteAddr(), "err", tooLarge)
	if f.IsRequest() && f.IsTwoWay() && !f.IsEvent() {
		sc.answer(req, protocol.StatusBadRequest, []byte(tooLarge.Error()))
	}
	return true
}

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

// dispatch runs one request, or answers it at once when it cannot run.
func (sc *serverConn) dispatch(call *serverCall) {
	s := sc.s
	req := &call.req
	twoWay := req.Header.Flags().IsTwoWay()
	var status protocol.Status
	var msg []byte
	switch {
	case s.shutting.Load():
		status, msg = protocol.StatusServerThreadpoolExhausted, msgShuttingDown
	case req.Timeout < 0:
		status, msg = protocol.StatusServerTimeout, msgBudgetSpent
	case s.slots.Add(1) > int64(s.cfg.MaxConcurrent):
		s.slots.Add(-1)
		status, msg = protocol.StatusServerThreadpoolExhausted, msgBusy
	default:
		if s.active.Add(1); s.shutting.Load() { // Shutdown began meanwhile
			s.slots.Add(-1)
			s.release()
			status, msg = protocol.StatusServerThreadpoolExhausted, msgShuttingDown
		}
	}
	if status != 0 {
		if twoWay {
			if status == protocol.StatusServerThreadpoolExhausted && s.shutting.Load() {
				sc.announce() // the client learns why before it sees the 100
			}
			sc.answer(req, status, msg)
		}
		putServerCall(call)
		return
	}
	call.sc = sc
	if twoWay || req.Timeout > 0 {
		var deadline time.Time
		if req.Timeout > 0 {
			deadline = time.Now().Add(req.Timeout)
		}
		call.ctx = newHandlerCtx(s.base, deadline, req)
	}
	if twoWay {
		// Tracked here, on the reader goroutine, so a cancel read after
		// this request always finds it.
		sc.callsMu.Lock()
		sc.running[req.Header.ID()] = call
		sc.callsMu.Unlock()
	}
	if w := s.takeIdle(); w != nil {
		w.ch <- call
		return
	}
	s.wg.Add(1)
	go s.worker(call)
}

// workerIdle is how long a worker goroutine stays idle, at least, before
// it exits.
const workerIdle = 5 * time.Second

// idleWorker is a worker goroutine waiting for a request.
type idleWorker struct {
	ch  chan *serverCall // capacity 1; nil tells the worker to exit
	gen uint64           // reapGen when it went idle
}

// worker runs call, then serves further requests handed to it while it is
// idle. Reusing goroutines saves the allocation a go statement with an
// argument costs per request (BenchmarkRoundTrip: 1 -> 0 allocs, time within
// the noise) and keeps grown stacks warm.
//
// An idle worker waits on its own channel, taken off a stack by dispatch:
// a single channel receive, with no timer and no select, because a
// select over the work, an idle timer and the server's context cost the
// server ~12 % of its CPU at c=1024 (dabbbench profile), and arming the
// timer woke the network poller on every call. Long-idle workers are
// retired by one reaper timer per server instead (reap).
func (s *Server) worker(call *serverCall) {
	defer s.wg.Done()
	w := &idleWorker{ch: make(chan *serverCall, 1)}
	for call != nil {
		call.run()
		if !s.putIdle(w) {
			return
		}
		call = <-w.ch
	}
}

// takeIdle pops the most recently idle worker, or returns nil.
func (s *Server) takeIdle() *idleWorker {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	n := len(s.idleWorkers)
	if n == 0 {
		return nil
	}
	w := s.idleWorkers[n-1]
	s.idleWorkers[n-1] = nil
	s.idleWorkers = s.idleWorkers[:n-1]
	return w
}

// putIdle pushes w on the idle stack; false means the server is closing
// and the worker must exit.
func (s *Server) putIdle(w *idleWorker) bool {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	if s.workersClosed {
		return false
	}
	w.gen = s.reapGen
	s.idleWorkers = append(s.idleWorkers, w)
	if s.reaper == nil {
		s.reaper = time.AfterFunc(workerIdle, s.reap)
	}
	return true
}

// reap retires the workers that have been idle since before the previous
// reap, a whole workerIdle period at least. The stack holds them at its
// bottom: workers are pushed in the order they went idle.
func (s *Server) reap() {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	if s.workersClosed {
		return
	}
	old := 0
	for old < len(s.idleWorkers) && s.idleWorkers[old].gen < s.reapGen {
		s.idleWorkers[old].ch <- nil
		old++
	}
	n := copy(s.idleWorkers, s.idleWorkers[old:])
	clear(s.idleWorkers[n:])
	s.idleWorkers = s.idleWorkers[:n]
	s.reapGen++
	if n == 0 {
		s.reaper = nil // the next worker to go idle starts it again
		return
	}
	s.reaper.Reset(workerIdle)
}

// closeWorkers makes idle workers exit now and busy ones once their call
// is done.
func (s *Server) closeWorkers() {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	s.workersClosed = true
	for _, w := range s.idleWorkers {
		w.ch <- nil
	}
	s.idleWorkers = nil
	if s.reaper != nil {
		s.reaper.Stop()
		s.reaper = nil
	}
}

// announce sends the read-only event on this connection, once.
func (sc *serverConn) announce() {
	sc.announced.Do(func() { _ = sc.w.writeEvent(eventReadOnly, sc.nextID.Add(1)) })
}

func (sc *serverConn) answer(req *protocol.Message, status protocol.Status, msg []byte) {
	m := &sc.reply
	m.Header.Init(protocol.MakeFlags(0, req.Header.Flags().Serialization()), status, req.Header.ID())
	m.Payload = msg
	_, _ = sc.w.writeMessage(m, limit{})
	m.Payload = nil
}

// cancelCall cancels the handler context of the two-way call with the
// given id on this connection, after the client sent the cancel event for
// it. An unknown id (the call already finished) is ignored.
func (sc *serverConn) cancelCall(id uint64) {
	sc.callsMu.Lock()
	defer sc.callsMu.Unlock()
	if call := sc.running[id]; call != nil {
		call.cancelled.Store(true)
		call.ctx.cancel(context.Canceled)
	}
}

// run runs the handler and writes its response; it holds a MaxConcurrent
// slot until the handler has returned. The handler of a call the
// client cancelled before it started does not run, and the response of a
// cancelled call is not written: nobody waits for it.
func (call *serverCall) run() {
	// Deferred, so a handler that ends its goroutine (runtime.Goexit, as
	// t.FailNow does) still gets its answer written and its slot back.
	defer call.finish()
	s := call.sc.s
	req := &call.req
	if req.Header.Flags().IsTwoWay() || req.Timeout > 0 {
		if !call.cancelled.Load() {
			s.invoke(call.ctx, req, &call.resp)
		}
	} else {
		s.invoke(s.base, req, &call.resp)
	}
}

// finish ends a call after its handler: it writes the response, releases
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
	s.slots.Add(-1) // before the answer: see Server.slots
	// No response goes to a caller that gave up (the cancel event), nor
	// to one whose budget ran out while the handler ran: its own deadline
	// was no later than ours, so it has reported a timeout already (31,
	// "the server may have acted"), and an answer racing that report
	// would make the outcome depend on which timer fired first.
	if twoWay && !call.cancelled.Load() && !expired {
		status := resp.Header.Status()
		if status == 0 {
			status = protocol.StatusOK
		}
		resp.Header.Init(protocol.MakeFlags(0, req.Header.Flags().Serialization()), status, req.Header.ID())
		resp.Service, resp.Method, resp.Timeout = "", "", 0
		if n := protocol.BodyLen(resp); uint64(n) > uint64(s.cfg.MaxBody) {
			// The client would drop it, or with an older or smaller
			// limit close the connection under every call on it.
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
		// request's deadline: its caller has given up by then, and a
		// client that stopped reading must not pile up payloads here.
		if _, err := sc.w.writeMessage(resp, limit{deadline: call.ctx.deadline}); errors.Is(err, errBackedUp) {
			s.log.Warn("transport: client not reading its responses; closing the connection",
				"remote", sc.nc.RemoteAddr(), "err", err)
			sc.close()
		}
	}
	s.release()
	putServerCall(call)
}

// invoke calls the handler, turning a panic, or a handler that ends its
// goroutine with runtime.Goexit, into status 70 for this call.
func (s *Server) invoke(ctx context.Context, req, resp *protocol.Message) {
	returned := false
	defer func() {
		v := recover()
		if v == nil && returned {
			return
		}
		msg := fmt.Sprintf("handler panic: %v", v)
		if v == nil {
			msg = "handler exited its goroutine (runtime.Goexit) without returning"
			s.log.Error("transport: "+msg, "service", req.Service, "method", req.Method)
		} else {
			s.log.Error("transport: handler panic", "service", req.Service, "method", req.Method,
				"panic", v, "stack", string(debug.Stack()))
		}
		resp.Reset()
		resp.Header.SetStatus(protocol.StatusServiceError)
		resp.Payload = append(resp.Payload, msg...)
	}()
	s.h.ServeRPC(ctx, req, resp)
	returned = true
}

// handlerCtx is a handler's context when its request is two-way or came
// with a budget: the server's base context (closed by Close), the
// deadline if any, and cancellation by the client's cancel event. It is
// one allocation per call; the channel, the deadline timer and the watch
// on the base context are set up only if Done (or AfterFunc, which
// derived contexts use) is called, and Err reads the clock until then.
// It is cancelled with context.Canceled when ServeRPC returns, like
// net/http's request context, and stays so.
type handlerCtx struct {
	base     context.Context // cancelled by the server's Close
	deadline time.Time       // zero: none
	// req is the request being served (Request), nil once the handler
	// returned: the message goes back to a pool then.
	req atomic.Pointer[protocol.Message]
	// What the context keeps of its request for good (RequestMetadata):
	// the decoded attachment map is the request's own, never reused.
	attachments    map[string]string
	idempotencyKey string

	mu       sync.Mutex // guards the fields below
	done     chan struct{}
	err      error
	finished bool // done is closed (or closedChan) and err set
	armed    bool // a channel, timer, base watch or after func was made
	timer    *time.Timer
	stopBase func() bool
	afters   []*afterFunc
}

func newHandlerCtx(base context.Context, deadline time.Time, req *protocol.Message) *handlerCtx {
	c := &handlerCtx{base: base, deadline: deadline,
		attachments: req.Attachments, idempotencyKey: req.IdempotencyKey}
	c.req.Store(req)
	return c
}

type afterFunc struct{ f func() }

// closedChan is the Done channel of a context finished before anyone asked.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

var _ context.Context = (*handlerCtx)(nil)

// Deadline returns the request's deadline, if it came with a budget.
func (c *handlerCtx) Deadline() (time.Time, bool) { return c.deadline, !c.deadline.IsZero() }

// handlerCtxKey is the context key under which a handler's context
// answers with itself (Request, RequestMetadata).
type handlerCtxKey struct{}

// Value answers handlerCtxKey with c; it carries no other values.
func (c *handlerCtx) Value(key any) any {
	if _, ok := key.(handlerCtxKey); ok {
		return c
	}
	return nil
}

// Request returns the request a handler's ctx (or a context derived from
// it) was made for, or nil: a server gives a handler such a context for
// every two-way request and every request with a budget, which lets
// layers above read the request without wrapping the context in a new
// value per call. The message is valid only until the handler returns;
// after that Request returns nil (the message is reused). What a context
// kept past the call may still read is RequestMetadata.
func Request(ctx context.Context) *protocol.Message {
	if c, ok := ctx.Value(handlerCtxKey{}).(*handlerCtx); ok {
		return c.req.Load()
	}
	return nil
}

// RequestMetadata returns the attachments and the idempotency key of the
// request a handler's ctx (or a context derived from it) was made for;
// ok is false for a context that is not one. Unlike Request, they stay
// valid after the handler returns, for a context kept for work that goes
// on (the map is the request's own: read it, do not modify it).
func RequestMetadata(ctx context.Context) (attachments map[string]string, idempotencyKey string, ok bool) {
	c, ok := ctx.Value(handlerCtxKey{}).(*handlerCtx)
	if !ok {
		return nil, "", false
	}
	return c.attachments, c.idempotencyKey, true
}

// Done returns a channel closed at the deadline, on server close, on the
// client's cancel event or when the handler returns.
func (c *handlerCtx) Done() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.armLocked()
	return c.done
}

// Err returns context.DeadlineExceeded or context.Canceled once the
// context is done, else nil.
func (c *handlerCtx) Err() error {
	c.mu.Lock()
	if c.finished || c.done != nil {
		err := c.err
		c.mu.Unlock()
		return err
	}
	err := c.expiredLocked()
	if err == nil {
		c.mu.Unlock()
		return nil
	}
	c.finishLocked(err) // nothing armed: nothing to stop or run
	c.mu.Unlock()
	return err
}

// AfterFunc runs f in its own goroutine once c is done (the interface
// context.WithCancel and context.AfterFunc look for); stop prevents that.
func (c *handlerCtx) AfterFunc(f func()) (stop func() bool) {
	c.mu.Lock()
	c.armLocked()
	c.armed = true // f may hold on to c even if it runs at once
	if c.finished {
		c.mu.Unlock()
		go f()
		return func() bool { return false }
	}
	a := &afterFunc{f: f}
	c.afters = append(c.afters, a)
	c.mu.Unlock()
	return func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		for i, x := range c.afters {
			if x == a {
				c.afters = append(c.afters[:i], c.afters[i+1:]...)
				return true
			}
		}
		return false
	}
}

func (c *handlerCtx) expiredLocked() error {
	if c.base.Err() != nil {
		return context.Canceled
	}
	if !c.deadline.IsZero() && !time.Now().Before(c.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// armLocked makes the done channel and starts watching the deadline and
// the base context.
func (c *handlerCtx) armLocked() {
	if c.done != nil {
		return
	}
	if err := c.expiredLocked(); err != nil {
		c.finishLocked(err)
		return
	}
	c.armed = true
	c.done = make(chan struct{})
	if !c.deadline.IsZero() {
		c.timer = time.AfterFunc(time.Until(c.deadline), func() { c.cancel(context.DeadlineExceeded) })
	}
	c.stopBase = context.AfterFunc(c.base, func() { c.cancel(context.Canceled) })
}

// finishLocked marks c done with err. The caller stops the timer and the
// base watch and runs the after funcs, outside the lock.
func (c *handlerCtx) finishLocked(err error) {
	c.finished = true
	c.err = err
	if c.done == nil {
		c.done = closedChan
	} else {
		close(c.done)
	}
}

// cancel finishes c with err unless it is already done.
func (c *handlerCtx) cancel(err error) {
	c.mu.Lock()
	if c.finished {
		c.mu.Unlock()
		return
	}
	c.finishLocked(err)
	timer, stopBase, afters := c.timer, c.stopBase, c.afters
	c.afters = nil
	c.mu.Unlock()
	if timer != nil {
		timer.Stop()
	}
	if stopBase != nil {
		stopBase()
	}
	for _, a := range afters {
		go a.f()
	}
}

// String names the context in panics and logs.
func (c *handlerCtx) String() string {
	if c.deadline.IsZero() {
		return "transport.handlerCtx"
	}
	return "transport.handlerCtx(deadline " + c.deadline.Format(time.RFC3339Nano) + ")"
}
