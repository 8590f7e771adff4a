// Tests of admission at MaxConns: which connection is closed to make room,
// and when a new one is refused.

package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// gateServer's handler reports each call on entered, then answers a
// "quick" one at once and blocks the others until release is closed.
type gateServer struct {
	*testServer
	entered chan string
	release chan struct{}
}

func startGateServer(t *testing.T, cfg ServerConfig) *gateServer {
	gs := &gateServer{entered: make(chan string, 100), release: make(chan struct{})}
	gs.testServer = startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		gs.entered <- string(req.Payload)
		if string(req.Payload) != "quick" {
			select {
			case <-gs.release:
			case <-ctx.Done():
			}
		}
		resp.Payload = append(resp.Payload[:0], req.Payload...)
	}), cfg)
	return gs
}

// blockedCall starts a call on its own one-connection pool that blocks in
// bs's handler, and returns its result channel once the handler has it.
func blockedCall(t *testing.T, bs *gateServer, payload string) <-chan error {
	t.Helper()
	p := newPool(t, Config{ConnsPerAddr: 1})
	done := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(context.Background(), bs.addr, newRequest(payload))
		if err == nil {
			p.Release(resp)
		}
		done <- err
	}()
	if got := waitFor(t, bs.entered, "the handler to take "+payload); got != payload {
		t.Fatalf("the handler took %q, want %q", got, payload)
	}
	return done
}

// validConn dials addr and does one heartbeat: the server has read a valid
// frame from it, and no call.
func validConn(t *testing.T, addr string) (net.Conn, *protocol.Reader) {
	t.Helper()
	c := dialRaw(t, addr)
	rd := protocol.NewReader(bufio.NewReader(c), 0)
	heartbeat(t, c, rd, 1)
	return c, rd
}

// When every connection has a call in flight, none can be closed: a new
// one is turned away (the go-away event, 100 to a request, the close
// after evictLinger), counted as RejectMaxConns, and logged once a second
// at most.
func TestMaxConnsRefusesWhenAllBusy(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	obs := &countingObserver{}
	const limit = 3
	bs := startGateServer(t, ServerConfig{MaxConns: limit, Logger: log, Observer: obs})
	var calls []<-chan error
	for i := range limit {
		calls = append(calls, blockedCall(t, bs, "held"+string(rune('0'+i))))
	}

	start := time.Now()
	const surplus = 5
	var wg sync.WaitGroup
	for i := range surplus {
		c := dialRaw(t, bs.addr)
		from := time.Now()
		wg.Go(func() {
			// Turned away: the go-away event, then the close after
			// evictLinger, as its peer does not close it.
			_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
			var m protocol.Message
			if err := protocol.NewReader(bufio.NewReader(c), 0).Read(&m); err != nil || !m.IsGoAway() {
				t.Errorf("surplus conn %d: first frame %v (flags %#02x), want the go-away event", i, err, byte(m.Header.Flags()))
				return
			}
			if d := closedWithin(t, c, from, 5*time.Second); d > evictLinger+3*time.Second {
				t.Errorf("surplus conn %d closed after %v, want within %v", i, d, evictLinger)
			}
		})
	}
	// One that sent a request has it answered 100, not run.
	c := dialRaw(t, bs.addr)
	rd := protocol.NewReader(bufio.NewReader(c), 0)
	req := newRequest("quick")
	req.Header.SetID(5)
	if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write a request on a connection turned away: %v", err)
	}
	readUntilGoAway(t, c, rd)
	if m := readResponse(t, rd, c); m.Header.ID() != 5 || m.Header.Status() != protocol.StatusServerThreadpoolExhausted {
		t.Errorf("answer on a connection turned away: id %d, status %d, want id 5, status 100", m.Header.ID(), m.Header.Status())
	}
	wg.Wait()
	if n := obs.maxConns.Load(); n != surplus+1 {
		t.Errorf("%d connections counted as RejectMaxConns, want %d", n, surplus+1)
	}
	lines := strings.Count(logs.String(), "too many connections")
	if lines < 1 || (time.Since(start) < time.Second && lines != 1) {
		t.Errorf("%d log lines for %d surplus connections within %v, want 1:\n%s",
			lines, surplus, time.Since(start), logs.String())
	}
	close(bs.release)
	for i, done := range calls {
		if err := waitFor(t, done, "a held call"); err != nil {
			t.Errorf("held call %d: %v (a connection with a call in flight was cut)", i, err)
		}
	}
}

// setGrace sets the time a new connection has to send a valid frame
// before it is evicted ahead of idle ones.
func setGrace(s *Server, d time.Duration) {
	s.mu.Lock()
	s.grace = d
	s.mu.Unlock()
}

// At MaxConns, a new connection takes the place of, in turn: the oldest
// one without a valid frame past its grace; the oldest that never made a
// call; the one longest idle since its last answer; never one with a call
// in flight.
func TestMaxConnsEvictionOrder(t *testing.T) {
	obs := &countingObserver{}
	bs := startGateServer(t, ServerConfig{MaxConns: 4, Observer: obs})
	setGrace(bs.srv, time.Hour) // every silent connection is in its grace
	// A call that is answered at once. The server counts a call done
	// after it wrote the answer: ran waits until it counts p's connection
	// idle, so the connections go idle in the order of the calls.
	ran := func(p *Pool) {
		t.Helper()
		resp, err := p.RoundTrip(testCtx(t), bs.addr, newRequest("quick"))
		if err != nil {
			t.Fatalf("quick call: %v", err)
		}
		p.Release(resp)
		waitFor(t, bs.entered, "the handler's report of a quick call")
		p.mu.Lock()
		var local string
		for c := range p.conns {
			local = c.nc.LocalAddr().String()
		}
		p.mu.Unlock()
		eventually(t, "the server to count the call done", func() bool {
			bs.srv.mu.Lock()
			defer bs.srv.mu.Unlock()
			for sc := range bs.srv.conns {
				if sc.nc.RemoteAddr().String() == local {
					return sc.inflight.Load() == 0 && sc.idleSince.Load() != 0
				}
			}
			return false
		})
	}
	called := newPool(t, Config{ConnsPerAddr: 1})
	ran(called) // the first connection, idle since its answer
	idleA, _ := validConn(t, bs.addr)
	silent := dialRaw(t, bs.addr)
	if _, err := silent.Write(halfHeader); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the server to hold the silent connection", func() bool { return bs.srv.nconns.Load() == 3 })
	busy := blockedCall(t, bs, "busy")

	// Full. The silent connection is in its grace. idleA, which never
	// made a call, goes before the older one that did.
	idleD, rdD := validConn(t, bs.addr)
	closedWithin(t, idleA, time.Now(), 5*time.Second)

	// Its grace over, the silent connection goes first.
	setGrace(bs.srv, 0)
	idleE, rdE := validConn(t, bs.addr)
	closedWithin(t, silent, time.Now(), 5*time.Second)
	heartbeat(t, idleD, rdD, 2)

	// Then idleD, the older of the two that never made a call.
	validConn(t, bs.addr)
	closedWithin(t, idleD, time.Now(), 5*time.Second)
	heartbeat(t, idleE, rdE, 2)

	// The connection that made a call is still there: another call on
	// it opens none.
	opened := obs.opened.Load()
	ran(called)
	if n := obs.opened.Load() - opened; n != 0 {
		t.Errorf("a call on the connection that made one opened %d connections: it was closed", n)
	}

	// With only connections that made calls, the one idle longest goes.
	// Pools p1 and p2 take the places of idleE and the last one; then p3
	// takes that of called, idle since before p1 and p2 called.
	p1, p2, p3 := newPool(t, Config{ConnsPerAddr: 1}), newPool(t, Config{ConnsPerAddr: 1}), newPool(t, Config{ConnsPerAddr: 1})
	ran(p1)
	ran(p2)
	// The server counts a call done after it wrote the answer: wait
	// until it counts called, p1 and p2 idle, or p3 may find one of them
	// still in flight.
	eventually(t, "called, p1 and p2 idle on the server", func() bool {
		bs.srv.mu.Lock()
		defer bs.srv.mu.Unlock()
		idle := 0
		for sc := range bs.srv.conns {
			if sc.inflight.Load() == 0 && sc.idleSince.Load() != 0 {
				idle++
			}
		}
		return idle == 3
	})
	opened = obs.opened.Load()
	ran(p3)
	ran(p1)
	ran(p2)
	if n := obs.opened.Load() - opened; n != 1 {
		t.Errorf("p3 and a call each on p1 and p2 opened %d connections, want 1 (p3's)", n)
	}
	// p3 took called's place: wait until called's pool has seen the close,
	// or its next call may cross it.
	waitNoConns(t, called, "called's pool to see its connection closed for p3")
	ran(called)
	if n := obs.opened.Load() - opened; n != 2 {
		t.Errorf("the connection idle longest was not the one closed for p3: a call on it opened %d connections in all, want 2", n)
	}

	close(bs.release)
	if err := waitFor(t, busy, "the busy call"); err != nil {
		t.Errorf("the call in flight failed: %v (its connection was cut)", err)
	}
	if n := obs.maxConns.Load(); n != 0 {
		t.Errorf("%d connections refused, want 0: each could make room", n)
	}
}

// MaxConns holds over all of a server's listeners: of connections racing
// in through two of them, each with a call to make, MaxConns are served
// and the others closed.
func TestMaxConnsOverListeners(t *testing.T) {
	const limit, dials = 4, 40
	release := make(chan struct{})
	var entered atomic.Int32
	srv := NewServer(HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		entered.Add(1)
		select {
		case <-release:
		case <-ctx.Done():
		}
		resp.Payload = append(resp.Payload[:0], req.Payload...)
	}), ServerConfig{MaxConns: limit, Logger: quietLogger()})
	var addrs []string
	served := make(chan error, 2)
	for range 2 {
		l := listen(t)
		addrs = append(addrs, l.Addr().String())
		go func() { served <- srv.Serve(l) }()
	}
	t.Cleanup(func() {
		_ = srv.Close()
		for range 2 {
			if err := waitFor(t, served, "Serve to return"); !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		}
	})
	var wg sync.WaitGroup
	var held, closed atomic.Int32
	for i := range dials {
		c := dialRaw(t, addrs[i%2])
		wg.Go(func() {
			// A served connection's call blocks until release; a refused
			// one is closed before it is answered, an evicted one is sent
			// go-away and answered 100. A call in flight keeps its
			// connection, so MaxConns calls block.
			req := newRequest("call")
			req.Header.SetID(uint64(i + 1))
			if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
			m := new(protocol.Message)
			rd := protocol.NewReader(bufio.NewReader(c), 0)
			var err error
			for {
				if err = rd.Read(m); err != nil || !m.Header.Flags().IsEvent() {
					break
				}
			}
			switch {
			case err == nil && m.Header.Status() == protocol.StatusOK:
				held.Add(1)
			case err == nil && m.Header.Status() == protocol.StatusServerThreadpoolExhausted:
				closed.Add(1) // went away, not run
			case err == nil:
				t.Errorf("connection %d: status %v, want OK", i, m.Header.Status())
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Errorf("connection %d: neither answered nor closed within %v", i, defaultTestTimeout)
			default:
				closed.Add(1)
			}
		})
	}
	eventually(t, "MaxConns calls in their handlers and the other connections closed or answered 100", func() bool {
		return entered.Load() == limit && closed.Load() == dials-limit
	})
	if n := srv.nconns.Load(); n != limit {
		t.Errorf("the server counts %d connections, want %d", n, limit)
	}
	close(release)
	wg.Wait()
	if n := held.Load(); n != limit {
		t.Errorf("%d connections served, want MaxConns (%d)", n, limit)
	}
}

// attack holds connections to a server as an attacker does: each sends
// pre, then reads until the server closes it, then connects again after
// pause.
type attack struct {
	stop     chan struct{}
	wg       sync.WaitGroup
	mu       sync.Mutex // guards the fields below
	ended    bool
	conns    map[net.Conn]struct{}
	reopened atomic.Int64 // connections the server closed
}

// startAttack starts n connections to addr, each sending pre. The test's
// end stops them.
func startAttack(t *testing.T, addr string, n int, pre []byte, pause time.Duration) *attack {
	a := &attack{stop: make(chan struct{}), conns: make(map[net.Conn]struct{})}
	for range n {
		a.wg.Go(func() { a.hold(addr, pre, pause) })
	}
	t.Cleanup(a.end)
	return a
}

func (a *attack) hold(addr string, pre []byte, pause time.Duration) {
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			a.mu.Lock()
			ended := a.ended
			if !ended {
				a.conns[c] = struct{}{}
			}
			a.mu.Unlock()
			if ended {
				_ = c.Close()
				return
			}
			_, _ = c.Write(pre)
			_, _ = io.Copy(io.Discard, c) // until the server closes it, or end
			a.mu.Lock()
			delete(a.conns, c)
			a.mu.Unlock()
			_ = c.Close()
			a.reopened.Add(1)
		}
		t := time.NewTimer(pause)
		select {
		case <-a.stop:
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// end closes the attack's connections and waits for its goroutines.
func (a *attack) end() {
	a.mu.Lock()
	if !a.ended {
		a.ended = true
		close(a.stop)
		for c := range a.conns {
			_ = c.Close()
		}
	}
	a.mu.Unlock()
	a.wg.Wait()
}

// While an attacker holds every place with half headers and idle
// connections, reopening each one the server closes, a new client
// connects and calls within 1 s, every time, and neither its calls nor
// those of a client connected before fail.
//
// The shape is scaled down to fit the test's descriptors: MaxConns 300
// against 200 half headers and 150 idle connections. The full shape
// (MaxConns 10,000 against 1,000 half headers and 10,000 idle ones) is
// scripts/maxconns.sh; docs/performance.md has its result.
func TestMaxConnsUnderAttack(t *testing.T) {
	const maxConns, halves, idles, newcomers = 300, 200, 150, 10
	const pause = 20 * time.Millisecond
	obs := &countingObserver{}
	ts := startServer(t, echo, ServerConfig{MaxConns: maxConns, Observer: obs})
	running := newPool(t, Config{ConnsPerAddr: 1})
	call := func(p *Pool, ctx context.Context, payload string) error {
		resp, err := p.RoundTrip(ctx, ts.addr, newRequest(payload))
		if err != nil {
			return err
		}
		defer p.Release(resp)
		if string(resp.Payload) != payload {
			return errors.New("answered " + string(resp.Payload) + ", want " + payload)
		}
		return nil
	}
	if err := call(running, testCtx(t), "running"); err != nil {
		t.Fatalf("the running client's first call: %v", err)
	}
	stop := make(chan struct{})
	runErrs := make(chan error, 1)
	var runCalls atomic.Int64
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
			runCalls.Add(1)
			if err := call(running, testCtx(t), "running"); err != nil {
				select {
				case runErrs <- err:
				default:
				}
			}
		}
	})
	defer func() {
		close(stop)
		wg.Wait()
		select {
		case err := <-runErrs:
			t.Errorf("a call of the client connected before the attack failed: %v", err)
		default:
		}
		if runCalls.Load() == 0 {
			t.Errorf("the running client made no call during the attack")
		}
	}()

	half := startAttack(t, ts.addr, halves, halfHeader, pause)
	idle := startAttack(t, ts.addr, idles, protocol.AppendHeartbeat(nil, 1), pause)
	for i := range newcomers {
		eventually(t, "the attacker to hold every place", func() bool { return ts.srv.nconns.Load() >= maxConns })
		p := NewPool(Config{ConnsPerAddr: 1, Logger: quietLogger()})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		start := time.Now()
		for j := range 3 {
			if err := call(p, ctx, "newcomer"); err != nil {
				t.Errorf("newcomer %d, call %d failed after %v: %v (want each call answered within 1s of its connect)",
					i, j, time.Since(start), err)
				break
			}
		}
		cancel()
		_ = p.Close()
	}
	if half.reopened.Load()+idle.reopened.Load() == 0 {
		t.Errorf("the server closed none of the attacker's connections to make room")
	}
	if n := obs.maxConns.Load(); n != 0 {
		t.Errorf("%d connections refused; want 0: there was always one to close", n)
	}
}

// rankOf puts a client between two calls, answered within the grace,
// after every other connection, so that the race of its next request
// with the close is the last risked; answered before the grace, it is
// an idle connection like any other.
func TestRankOfRecentAnswerLast(t *testing.T) {
	now := time.Now().UnixNano()
	born := now - int64(time.Second)
	conn := func(valid bool, accepted, idleSince, inflight int64) *serverConn {
		sc := &serverConn{accepted: accepted}
		sc.watch.valid.Store(valid)
		sc.idleSince.Store(idleSince)
		sc.inflight.Store(inflight)
		return sc
	}
	for _, tc := range []struct {
		name string
		sc   *serverConn
		want evictRank
		ok   bool
	}{
		{"silent", conn(false, born-1, 0, 0), rankSilent, true},
		{"uncalled", conn(true, born-1, 0, 0), rankUncalled, true},
		{"idle past the grace", conn(true, born-5, born-1, 0), rankIdle, true},
		{"fresh", conn(false, now, 0, 0), rankFresh, true},
		{"answered within the grace", conn(true, born-5, now, 0), rankRecent, true},
		{"call in flight", conn(true, born-5, born-1, 1), 0, false},
	} {
		rank, _, ok := rankOf(tc.sc, born)
		if ok != tc.ok || (ok && rank != tc.want) {
			t.Errorf("%s: rank %d ok %v, want %d ok %v", tc.name, rank, ok, tc.want, tc.ok)
		}
	}
	if !(rankSilent < rankUncalled && rankUncalled < rankIdle && rankIdle < rankFresh && rankFresh < rankRecent) {
		t.Error("the ranks are out of order")
	}
}

// readUntilGoAway reads frames from c until the go-away event, skipping
// the server's heartbeats, with a bounded wait.
func readUntilGoAway(t *testing.T, c net.Conn, rd *protocol.Reader) {
	t.Helper()
	for {
		m := readResponse(t, rd, c)
		if m.IsGoAway() {
			return
		}
		if !m.IsHeartbeat() {
			t.Fatalf("read a frame with flags %#02x before the go-away event", byte(m.Header.Flags()))
		}
	}
}

// A connection closed to make room is sent the go-away event first, and
// a request read on it after that is answered 100, not run, where it was
// dropped unanswered with the close. The connection stays open until its
// peer closes it, or evictLinger.
func TestEvictionGoAway(t *testing.T) {
	obs := &countingObserver{}
	gs := startGateServer(t, ServerConfig{MaxConns: 1, Observer: obs})
	victim, rd := validConn(t, gs.addr)
	validConn(t, gs.addr) // takes the victim's place
	readUntilGoAway(t, victim, rd)
	if n := gs.srv.nconns.Load(); n != 1 {
		t.Errorf("MaxConns places held after the eviction: %d, want 1 (the victim gave its place back)", n)
	}

	req := newRequest("quick")
	req.Header.SetID(7)
	if _, err := victim.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write a request after go-away: %v", err)
	}
	m := readResponse(t, rd, victim)
	if m.Header.ID() != 7 || m.Header.Status() != protocol.StatusServerThreadpoolExhausted || !strings.Contains(string(m.Payload), "make room") {
		t.Fatalf("answer to a request after go-away: id %d, status %d, %q; want id 7, status 100, the go-away message",
			m.Header.ID(), m.Header.Status(), m.Payload)
	}
	select {
	case p := <-gs.entered:
		t.Fatalf("the handler ran %q on the connection that went away", p)
	default:
	}
	if n := obs.goneAway.Load(); n != 1 {
		t.Errorf("RejectGoneAway reported %d times, want 1", n)
	}

	// The peer closes it: the server forgets it.
	_ = victim.Close()
	eventually(t, "the server to forget the connection its peer closed", func() bool {
		gs.srv.mu.Lock()
		defer gs.srv.mu.Unlock()
		return len(gs.srv.conns) == 1 && gs.srv.lingering.Load() == 0
	})

	// A peer that does not close it is closed after evictLinger.
	validConn(t, gs.addr) // evicts the second one
	gone := time.Now()
	eventually(t, "a lingering connection", func() bool { return gs.srv.lingering.Load() == 1 })
	eventually(t, "the lingering connection to be closed", func() bool { return gs.srv.lingering.Load() == 0 })
	if took := time.Since(gone); took > evictLinger+5*time.Second {
		t.Errorf("the lingering connection closed %v after the eviction, want about %v", took, evictLinger)
	}
}

// A connection whose grace ended without a valid frame is closed at once,
// with no go-away event and no linger.
func TestEvictionClosesSilentAtOnce(t *testing.T) {
	gs := startGateServer(t, ServerConfig{MaxConns: 1})
	setGrace(gs.srv, 0)
	silent := dialRaw(t, gs.addr)
	eventually(t, "the server to hold the silent connection", func() bool { return gs.srv.nconns.Load() == 1 })
	validConn(t, gs.addr)
	_ = silent.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	b, err := io.ReadAll(silent)
	if len(b) != 0 || err != nil {
		t.Errorf("the silent connection read %d bytes (% x), %v before its close; want none and EOF", len(b), b, err)
	}
	if n := gs.srv.lingering.Load(); n != 0 {
		t.Errorf("%d connections lingering, want 0", n)
	}
}

// Past maxLingering connections lingering, a connection evicted and one
// turned away are closed at once, with no go-away event; the count is
// not changed by them.
func TestLingeringBounded(t *testing.T) {
	gs := startGateServer(t, ServerConfig{MaxConns: 1})
	// No real connection lingers: the count stands for 64 that do.
	gs.srv.lingering.Store(maxLingering)
	t.Cleanup(func() { gs.srv.lingering.Store(0) })
	closedBare := func(what string, c net.Conn) {
		t.Helper()
		_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		b, err := io.ReadAll(c)
		if len(b) != 0 || err != nil {
			t.Errorf("%s read %d bytes (% x), %v before its close; want none and EOF", what, len(b), b, err)
		}
	}

	victim, _ := validConn(t, gs.addr)
	validConn(t, gs.addr) // evicts victim
	closedBare("the connection evicted past maxLingering", victim)

	held := blockedCall(t, gs, "held") // on the place of the one above
	eventually(t, "the server to hold only the held call's connection", func() bool {
		gs.srv.mu.Lock()
		defer gs.srv.mu.Unlock()
		return len(gs.srv.conns) == 1
	})
	closedBare("the connection turned away past maxLingering", dialRaw(t, gs.addr))
	if n := gs.srv.lingering.Load(); n != maxLingering {
		t.Errorf("lingering = %d, want %d unchanged", n, maxLingering)
	}
	close(gs.release)
	if err := waitFor(t, held, "the held call"); err != nil {
		t.Errorf("held call: %v", err)
	}
}

// A pool whose connection went away sends its next call on a new one:
// the call succeeds, and the old connection is closed once drained.
func TestEvictedPoolCallsOnNewConnection(t *testing.T) {
	obs := &countingObserver{}
	gs := startGateServer(t, ServerConfig{MaxConns: 1, Observer: obs})
	p := newPool(t, Config{ConnsPerAddr: 1})
	call := func() {
		t.Helper()
		resp, err := p.RoundTrip(testCtx(t), gs.addr, newRequest("quick"))
		if err != nil {
			t.Fatalf("call: %v", err)
		}
		p.Release(resp)
		waitFor(t, gs.entered, "the handler's report of the call")
	}
	call()
	eventually(t, "the pool's connection idle on the server", func() bool {
		gs.srv.mu.Lock()
		defer gs.srv.mu.Unlock()
		for sc := range gs.srv.conns {
			return sc.inflight.Load() == 0 && sc.idleSince.Load() != 0
		}
		return false
	})
	validConn(t, gs.addr) // takes the pool's place
	waitNoConns(t, p, "the pool to close the connection that went away")
	opened := obs.opened.Load()
	call()
	if n := obs.opened.Load() - opened; n != 1 {
		t.Errorf("the call after go-away opened %d connections, want 1", n)
	}
}

// A call that picked a connection just before the server's go-away
// reached it is refused there before its request is written, and goes on
// a new connection to the address, where it succeeds.
func TestGoneAwayAfterPickSendsOnNewConnection(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("first"))
	if err != nil {
		t.Fatal(err)
	}
	p.Release(resp)
	e := (*p.eps.Load())[ts.addr]
	picked := e.slots[0].Load()
	// The go-away event, as the connection's reader reads it.
	var ev protocol.Message
	if err := protocol.NewReader(bufio.NewReader(bytes.NewReader(protocol.AppendGoAway(nil, 9))), 0).Read(&ev); err != nil {
		t.Fatal(err)
	}
	picked.event(&ev)
	resp, err = e.send(testCtx(t), 0, picked, newRequest("second"), time.Time{})
	if err != nil {
		t.Fatalf("a call on a connection that went away after the pick: %v", err)
	}
	if string(resp.Payload) != "second" {
		t.Errorf("answer %q, want the echo of \"second\"", resp.Payload)
	}
	p.Release(resp)
	if now := e.slots[0].Load(); now == picked || now == nil {
		t.Error("the call did not go on a new connection")
	}
}

// Under evictions, a call never fails ambiguously: each one either
// succeeds or is answered 100, not run, on a connection that went away.
// Before go-away, a request that crossed the close failed as "connection
// lost", and its caller could not tell whether it ran.
func TestEvictionNeverCutsACall(t *testing.T) {
	const clients, evictions = 4, 300
	ts := startServer(t, echo, ServerConfig{MaxConns: clients})
	stop := make(chan struct{})
	var calls, notRun atomic.Int64
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		p := newPool(t, Config{ConnsPerAddr: 1})
		wg.Go(func() {
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				payload := strconv.Itoa(i) + "/" + strconv.Itoa(n)
				resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest(payload))
				calls.Add(1)
				if err == nil {
					p.Release(resp)
					continue
				}
				var pe *protocol.Error
				if errors.As(err, &pe) && ((pe.Remote && pe.Status == protocol.StatusServerThreadpoolExhausted) || errors.Is(err, ErrNotSent)) {
					notRun.Add(1)
					continue
				}
				errs <- err
				return
			}
		})
	}
	// Each new connection takes the place of an idle client's, then
	// closes, leaving the place to the client's next connection. One
	// that finds every client with a call in flight is closed at accept.
	admitted := 0
	for range evictions {
		c := dialRaw(t, ts.addr)
		_ = c.SetDeadline(time.Now().Add(defaultTestTimeout))
		if _, err := c.Write(protocol.AppendHeartbeat(nil, 1)); err == nil {
			var m protocol.Message
			if protocol.NewReader(bufio.NewReader(c), 0).Read(&m) == nil {
				admitted++
			}
		}
		_ = c.Close()
		select {
		case err := <-errs:
			close(stop)
			wg.Wait()
			t.Fatalf("a call failed and may have run: %v", err)
		default:
		}
	}
	close(stop)
	wg.Wait()
	select {
	case err := <-errs:
		t.Fatalf("a call failed and may have run: %v", err)
	default:
	}
	t.Logf("%d calls beside %d connections admitted at MaxConns, %d calls not run", calls.Load(), admitted, notRun.Load())
	if calls.Load() == 0 || admitted == 0 {
		t.Fatalf("%d calls, %d connections admitted at MaxConns: the test exercised nothing", calls.Load(), admitted)
	}
}
