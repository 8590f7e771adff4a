// The Server's lifecycle: accept, Serve, Shutdown, Close.

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
	"golang.org/x/sync/semaphore"
)

// ErrServerClosed is returned by Serve after Shutdown or Close.
var ErrServerClosed = errors.New("transport: server closed")

// Messages of the statuses the server makes itself.
var (
	msgShuttingDown = []byte("server shutting down")
	msgBusy         = []byte("server busy: too many concurrent requests")
	msgGoneAway     = []byte("connection closed to make room for a new one (MaxConns); not run, send it again")
	msgBudgetSpent  = []byte("timeout budget spent before the handler ran")
)

// Server serves requests on any number of listeners.
// Create it with NewServer.
type Server struct {
	h      Handler
	cfg    ServerConfig
	log    *slog.Logger
	base   context.Context // parent of every handler's ctx
	cancel context.CancelFunc

	// slots counts the requests holding a MaxConcurrent slot.
	// dispatch takes one; finish gives it back before the response.
	slots atomic.Int64
	// active counts the requests from dispatch until their response is
	// in the writer. Shutdown waits for it to reach 0.
	active atomic.Int64
	idle   chan struct{} // signalled when active drops to 0 after serving
	quit   chan struct{} // closed when the server leaves serving
	wg     sync.WaitGroup

	workers *workers // runs the calls; its goroutines count in wg
	inline  inlineWatch

	mu sync.Mutex // guards the fields below
	// state holds the serverState. Only enter writes it, holding mu.
	// The request path reads it without the lock.
	state     atomic.Int32
	listeners map[net.Listener]*listenerState
	conns     map[*serverConn]struct{}
	// drains counts the Serve loops that still owe Shutdown a drain of
	// their accept queue (listenerState.drain). It is a fact about each
	// listener, not about the server, so it stays apart from state.
	drains sync.WaitGroup

	// bodies holds the BodyBudget: the bytes of the large bodies being
	// received.
	bodies *semaphore.Weighted

	// nconns counts the places of MaxConns taken: the tracked
	// connections and those accepted that track has not yet taken.
	nconns atomic.Int64
	// refusedLog and evictedLog are when a connection refused, or
	// closed to make room, at MaxConns was last logged, in Unix
	// nanoseconds. evicted counts the connections closed to make room
	// since the last such line.
	refusedLog atomic.Int64
	evictedLog atomic.Int64
	evicted    atomic.Int64
	// lingering counts the connections left open after their go-away
	// event (retire, turnAway).
	lingering atomic.Int64
	// grace is evictGrace of the config.
	grace time.Duration
	// victims are the next connections evict closes, from its last pass
	// over conns. Guarded by mu.
	victims []candidate

	peerLogMu  sync.Mutex           // guards peerLogged
	peerLogged map[string]time.Time // by IP: when a refused connection was last logged
}

// serverState is where a Server is in its life.
// It moves only forward, and only in enter:
//
//	serving  -> draining  Shutdown began
//	serving  -> closed    Close
//	draining -> closed    Shutdown is done, its ctx ended, or Close
type serverState int32

const (
	// serving accepts connections and runs requests.
	serving serverState = iota
	// draining accepts only what the listeners have queued, answers
	// requests with status 100 and waits for running handlers.
	draining
	// closed has closed every listener and connection and cancelled
	// the handlers' contexts. Idle workers exit.
	closed
)

// current returns the server's state.
func (s *Server) current() serverState { return serverState(s.state.Load()) }

// enter moves the server to state to and does what the move requires.
// It reports whether the state changed. It never moves backward.
// Entering closed again closes whatever is still open. So every Close
// returns after the listeners and connections are closed.
func (s *Server) enter(to serverState) bool {
	s.mu.Lock()
	from := s.current()
	if to < from || (to == from && to != closed) {
		s.mu.Unlock()
		return false
	}
	s.state.Store(int32(to))
	if from == serving {
		close(s.quit)
	}
	for l, st := range s.listeners {
		if to == draining {
			if dl, ok := l.(deadliner); ok {
				// Its Serve loop accepts what is queued, then closes
				// it (drainQueue); Shutdown waits for s.drains.
				st.drain = true
				s.drains.Add(1)
				_ = dl.SetDeadline(time.Now()) // wakes the loop's Accept
				continue
			}
		}
		_ = l.Close()
	}
	var conns []*serverConn
	if to == closed {
		conns = s.openConnsLocked()
	}
	s.mu.Unlock()
	if to == closed {
		// Connections first, so no handler answers once Close was called.
		for _, sc := range conns {
			sc.close()
		}
		s.cancel()
		s.workers.close()
	}
	return from != to
}

// NewServer returns a Server that serves requests with h.
// A nil h answers every request with status 60. NewServer does no I/O.
func NewServer(h Handler, cfg ServerConfig) *Server {
	if h == nil {
		h = HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
			resp.SetError(&protocol.Error{Status: protocol.StatusServiceNotFound,
				Code: protocol.CodeUnimplemented, Msg: "transport: no handler"})
		})
	}
	cfg = cfg.withDefaults()
	s := &Server{
		h:         h,
		cfg:       cfg,
		log:       cfg.Logger,
		idle:      make(chan struct{}, 1),
		quit:      make(chan struct{}),
		listeners: make(map[net.Listener]*listenerState),
		conns:     make(map[*serverConn]struct{}),
		bodies:    semaphore.NewWeighted(cfg.BodyBudget),
	}
	s.workers = newWorkers(&s.wg)
	s.grace = evictGrace(&s.cfg)
	if s.log == nil {
		s.log = slog.Default()
	}
	s.base, s.cancel = context.WithCancel(context.Background())
	return s
}

// Serve accepts connections on l and serves them until Shutdown or Close.
// Then it returns ErrServerClosed. It retries failed accepts after a
// short backoff. Serve closes l when it returns.
func (s *Server) Serve(l net.Listener) error {
	s.mu.Lock()
	if s.current() != serving {
		s.mu.Unlock()
		_ = l.Close()
		return ErrServerClosed
	}
	st := &listenerState{}
	s.listeners[l] = st
	s.mu.Unlock()
	defer func() {
		s.endDrain(st)
		s.mu.Lock()
		delete(s.listeners, l)
		s.mu.Unlock()
		_ = l.Close()
	}()

	var delay time.Duration
	for {
		nc, err := l.Accept()
		if err != nil {
			if s.current() != serving {
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
		if s.full(nc) {
			continue
		}
		sc := newServerConn(s, nc)
		if !s.track(sc) {
			// Shutdown began after this Accept. Serve the connection as
			// one from the queue, unless the server is closed for good.
			sc.drained = true
			if !s.track(sc) {
				s.unplace()
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
	// drain asks the loop to accept what is queued before it closes its
	// listener. Server.drains counts it until the loop has.
	drain bool
}

// deadliner is a listener whose Accept can be given a deadline
// (*net.TCPListener, *net.UnixListener).
type deadliner interface{ SetDeadline(time.Time) error }

// queueDrainWindow is how long a draining listener waits for a further
// queued connection after the last one.
const queueDrainWindow = 10 * time.Millisecond

// drainQueue accepts the connections that completed their handshake
// before Shutdown, if Shutdown asked this loop to (st.drain). It serves
// them like every connection during Shutdown. They get the read-only
// event, and their requests get status 100: not run, safe to retry.
func (s *Server) drainQueue(l net.Listener, st *listenerState) {
	// Closing the listener instead would make the operating system reset
	// these connections. A client that has sent on one could not tell
	// that nothing ran.
	s.mu.Lock()
	drain := st.drain
	s.mu.Unlock()
	if !drain {
		return
	}
	defer s.endDrain(st)
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
		if s.full(nc) {
			continue
		}
		sc := newServerConn(s, nc)
		sc.drained = true
		if !s.track(sc) {
			s.unplace()
			_ = nc.Close()
			return
		}
		go sc.serve()
	}
}

// endDrain records that st's Serve loop owes Shutdown no drain.
func (s *Server) endDrain(st *listenerState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st.drain {
		st.drain = false
		s.drains.Done()
	}
}

// track registers a connection and counts its goroutine. It refuses
// every connection once the server is closed, and, while it drains, all
// but those accepted from a listener's queue (sc.drained).
func (s *Server) track(sc *serverConn) bool {
	s.mu.Lock()
	if st := s.current(); st == closed || (st == draining && !sc.drained) {
		s.mu.Unlock()
		return false
	}
	sc.placed.Store(!sc.placeless)
	s.conns[sc] = struct{}{}
	s.wg.Add(1)
	s.mu.Unlock()
	if o := s.cfg.Observer; o != nil && !sc.placeless {
		o.ConnOpened()
	}
	return true
}

// forget removes a closed connection.
func (s *Server) forget(sc *serverConn) {
	s.mu.Lock()
	_, ok := s.conns[sc]
	if ok {
		delete(s.conns, sc)
		s.givePlace(sc)
	}
	s.mu.Unlock()
	if o := s.cfg.Observer; ok && o != nil && !sc.placeless {
		o.ConnClosed()
	}
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

// Shutdown stops the server gracefully. It stops accepting and sends the
// read-only event on every open connection. From then on it answers new
// requests with status 100, "server shutting down": not run, safe to
// retry. It waits for the running handlers to finish and for their
// responses to be written.
//
// Then Shutdown lingers. It keeps reading, and rejecting, until each
// client has closed its connection, for at most ServerConfig.ShutdownLinger.
// A dabb Pool closes a connection once its last call on it is answered.
// So no request a dabb client sent goes unanswered. A peer that ignores
// the read-only event is closed when the linger runs out. A request it
// wrote after the server's last read is lost without an answer.
//
// Connections still in a listener's accept queue are accepted and served
// the same way before the listener closes. This needs a listener with
// SetDeadline, as TCP and Unix listeners have.
//
// If ctx ends first, Shutdown closes the server as Close does and returns
// ctx.Err().
func (s *Server) Shutdown(ctx context.Context) error {
	first := s.enter(draining)
	// Announce read-only on every connection at once. A client must know
	// why before it sees a 100. Otherwise it takes the server for an
	// overloaded one, and its breaker opens on a server about to restart.
	// A write can block on a full socket, so each runs on its own
	// goroutine. Closing the connections releases a stuck one.
	// Connections drained from the accept queues announce themselves.
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
			_ = s.Close()
			return ctx.Err()
		}
	}
	for s.active.Load() != 0 {
		select {
		case <-s.idle:
			// release signals once: pass it on to another Shutdown.
			if s.active.Load() == 0 {
				select {
				case s.idle <- struct{}{}:
				default:
				}
			}
		case <-ctx.Done():
			_ = s.Close()
			return ctx.Err()
		}
	}
	// Handlers are done. Wait until their responses left the writers.
	// Polled, like net/http's Shutdown: the wait is short and happens once.
	// The connections are those open now: an Accept that raced the
	// announcement serves its connection as one from the queue.
	poll := time.Millisecond
	for _, sc := range s.openConns() {
		for !sc.w.idle() {
			t := time.NewTimer(poll)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				_ = s.Close()
				return ctx.Err()
			}
			poll = min(2*poll, 20*time.Millisecond)
		}
	}
	err := s.linger(ctx)
	s.enter(closed)
	s.wg.Wait() // the handlers are done: only the readers are left to end
	return err
}

// linger waits until the peers closed every connection the server
// serves, or ShutdownLinger passed, and returns nil. If ctx ends first it
// returns ctx.Err(). A connection's done channel closes when its reader
// sees the peer go. Connections tracked while it waits (an Accept that
// raced Shutdown) are waited for too: a client's Pool may have sent on
// them already.
func (s *Server) linger(ctx context.Context) error {
	t := time.NewTimer(s.cfg.ShutdownLinger)
	defer t.Stop()
	for {
		conns := s.openConns()
		if len(conns) == 0 {
			return nil
		}
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
	}
}

// Close closes the listeners and connections at once and cancels the
// handlers' contexts. With ServerConfig.WaitForHandlers it waits for the
// handlers to return. Close is idempotent: every call returns nil.
func (s *Server) Close() error {
	s.enter(closed)
	if s.cfg.WaitForHandlers {
		s.wg.Wait()
	}
	// Otherwise a handler that ignores its context cannot hold the process
	// up. It runs on until it returns, and its answer goes nowhere.
	return nil
}

// release ends a request counted by active.
func (s *Server) release() {
	if s.active.Add(-1) == 0 && s.current() != serving {
		select {
		case s.idle <- struct{}{}:
		default:
		}
	}
}
