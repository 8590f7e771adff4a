// Tests of the Server lifecycle: Serve, Shutdown and Close.

package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// TestServerLifecycle: the state only moves forward (serving, draining,
// closed), and Close returns nil however often it is called.
func TestServerLifecycle(t *testing.T) {
	newSrv := func() *Server { return NewServer(echo, ServerConfig{Logger: quietLogger()}) }
	t.Run("enter moves only forward", func(t *testing.T) {
		s := newSrv()
		steps := []struct {
			to    serverState
			moved bool
			then  serverState
		}{
			{serving, false, serving},
			{draining, true, draining},
			{draining, false, draining},
			{serving, false, draining},
			{closed, true, closed},
			{closed, false, closed},
			{draining, false, closed},
		}
		for i, st := range steps {
			if moved := s.enter(st.to); moved != st.moved || s.current() != st.then {
				t.Errorf("step %d: enter(%d) = %v, state %d; want %v, state %d", i, st.to, moved, s.current(), st.moved, st.then)
			}
		}
	})
	t.Run("Close twice", func(t *testing.T) {
		s := newSrv()
		for i := range 2 {
			if err := s.Close(); err != nil {
				t.Errorf("Close #%d = %v, want nil", i+1, err)
			}
		}
		if s.current() != closed {
			t.Errorf("state after Close = %d, want closed", s.current())
		}
	})
	t.Run("Serve after Close", func(t *testing.T) {
		s := newSrv()
		_ = s.Close()
		l := listen(t)
		if err := s.Serve(l); !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve after Close = %v, want ErrServerClosed", err)
		}
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Errorf("Accept on the listener Serve refused = %v, want net.ErrClosed", err)
		}
	})
	t.Run("Shutdown after Close", func(t *testing.T) {
		s := newSrv()
		_ = s.Close()
		if err := s.Shutdown(testCtx(t)); err != nil {
			t.Errorf("Shutdown after Close = %v, want nil", err)
		}
	})
	t.Run("Close after Shutdown", func(t *testing.T) {
		ts := startServer(t, echo, ServerConfig{})
		p := newPool(t, Config{})
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		p.Release(resp)
		if err := ts.srv.Shutdown(testCtx(t)); err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		for i := range 2 {
			if err := ts.srv.Close(); err != nil {
				t.Errorf("Close #%d after Shutdown = %v, want nil", i+1, err)
			}
		}
	})
}

// TestServeAcceptRetry checks that a failing Accept is retried.
func TestServeAcceptRetry(t *testing.T) {
	l := &flakyListener{Listener: listen(t), failures: 3}
	ts := startServerOn(t, l, echo, ServerConfig{})
	p := newPool(t, Config{})
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("through"))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	p.Release(resp)
	if l.failed.Load() != 3 {
		t.Errorf("%d accept failures seen, want 3", l.failed.Load())
	}
}

type flakyListener struct {
	net.Listener
	failures int32
	failed   atomic.Int32
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failed.Load() < l.failures {
		l.failed.Add(1)
		return nil, errTemporary
	}
	return l.Listener.Accept()
}

var errTemporary = errors.New("accept: too many open files")

// TestStopWithAHandlerIgnoringItsContext: Close, and a Shutdown whose
// ctx has ended, return without waiting for a handler that ignores its
// (cancelled) context; with WaitForHandlers they wait for it.
func TestStopWithAHandlerIgnoringItsContext(t *testing.T) {
	for _, wait := range []bool{false, true} {
		for _, stop := range []string{"Close", "Shutdown"} {
			t.Run(fmt.Sprintf("%s/WaitForHandlers=%v", stop, wait), func(t *testing.T) {
				entered, release := make(chan struct{}), make(chan struct{})
				ts := startServer(t, HandlerFunc(func(_ context.Context, _, _ *protocol.Message) {
					close(entered)
					<-release // deaf to its context
				}), ServerConfig{WaitForHandlers: wait})
				p := newPool(t, Config{})
				go func() { _, _ = p.RoundTrip(context.Background(), ts.addr, newRequest("deaf")) }()
				waitFor(t, entered, "the handler")
				returned := make(chan struct{})
				go func() {
					defer close(returned)
					if stop == "Close" {
						_ = ts.srv.Close()
						return
					}
					ctx, cancel := context.WithCancel(context.Background())
					cancel()
					_ = ts.srv.Shutdown(ctx)
				}()
				if !wait {
					waitFor(t, returned, stop+" with a handler deaf to its context")
					close(release)
					return
				}
				select {
				case <-returned:
					t.Fatalf("%s with WaitForHandlers returned while the handler runs", stop)
				case <-time.After(100 * time.Millisecond): // a bound on what must not happen
				}
				close(release)
				waitFor(t, returned, stop+" once the handler returned")
			})
		}
	}
}

// longLinger is a ShutdownLinger no test waits out: a Shutdown that would
// have to fails on its testCtx (10s) first.
const longLinger = time.Minute

// watchListener reports on the server's side of its connections: accepts
// receives n each time Accept is entered after n connections were accepted
// (Serve tracks a connection before it calls Accept again, so n connections
// are being served), and peerGone receives once per connection whose Read
// failed with anything but the server's own close: the peer closed it.
type watchListener struct {
	net.Listener
	accepted atomic.Int32
	accepts  chan int32
	peerGone chan net.Addr
}

func newWatchListener(t *testing.T) *watchListener {
	return &watchListener{Listener: listen(t), accepts: make(chan int32, 100), peerGone: make(chan net.Addr, 100)}
}

func (l *watchListener) Accept() (net.Conn, error) {
	select {
	case l.accepts <- l.accepted.Load():
	default:
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted.Add(1)
	return &watchConn{Conn: c, l: l}, nil
}

// waitServing waits until n connections are being served.
func (l *watchListener) waitServing(t *testing.T, n int32) {
	t.Helper()
	for waitFor(t, l.accepts, fmt.Sprintf("the server to serve %d connections", n)) < n {
	}
}

type watchConn struct {
	net.Conn
	l    *watchListener
	once sync.Once
}

func (c *watchConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		c.once.Do(func() { c.l.peerGone <- c.RemoteAddr() })
	}
	return n, err
}

// serveRaw dials addr and waits until the server serves the connection (a
// heartbeat was answered), so a Shutdown started afterwards sees it.
func serveRaw(t *testing.T, addr string) (net.Conn, *protocol.Reader) {
	t.Helper()
	c := dialRaw(t, addr)
	rd := protocol.NewReader(bufio.NewReader(c), 0)
	if _, err := c.Write(protocol.AppendHeartbeat(nil, 1)); err != nil {
		t.Fatalf("write heartbeat: %v", err)
	}
	if m := readResponse(t, rd, c); !m.IsHeartbeatResponse() || m.Header.ID() != 1 {
		t.Fatalf("got flags %#x, want the heartbeat response", byte(m.Header.Flags()))
	}
	return c, rd
}

func startShutdown(t *testing.T, srv *Server) <-chan error {
	t.Helper()
	ctx := testCtx(t)
	done := make(chan error, 1)
	go func() { done <- srv.Shutdown(ctx) }()
	return done
}

func TestShutdownUnderLoad(t *testing.T) {
	const linger = time.Minute // a test that waits it out fails on testCtx first
	bs := startBlockingServer(t, ServerConfig{ShutdownLinger: linger})
	readOnly := make(chan string, 4)
	p := newPool(t, Config{OnReadOnly: func(a string) { readOnly <- a }})

	const inflight = 16
	results := make(chan error, inflight)
	for i := range inflight {
		go func() {
			want := fmt.Sprint("inflight-", i)
			resp, err := p.RoundTrip(context.Background(), bs.addr, newRequest(want))
			if err == nil {
				if string(resp.Payload) != want {
					err = fmt.Errorf("got %q, want %q", resp.Payload, want)
				}
				p.Release(resp)
			}
			results <- err
		}()
	}
	for range inflight {
		waitFor(t, bs.entered, "the in-flight handlers")
	}
	// A raw client that ignores the read-only event.
	raw := dialRaw(t, bs.addr)
	rawRd := protocol.NewReader(bufio.NewReader(raw), 0)
	hb := protocol.AppendHeartbeat(nil, 9) // make sure it is being served
	if _, err := raw.Write(hb); err != nil {
		t.Fatalf("write: %v", err)
	}
	readResponse(t, rawRd, raw)

	shutdown := make(chan error, 1)
	go func() { shutdown <- bs.srv.Shutdown(testCtx(t)) }()

	if got := waitFor(t, readOnly, "OnReadOnly"); got != bs.addr {
		t.Errorf("OnReadOnly(%q), want %q", got, bs.addr)
	}
	if !p.ReadOnly(bs.addr) {
		t.Errorf("ReadOnly(%s) = false during shutdown", bs.addr)
	}
	_, err := p.RoundTrip(testCtx(t), bs.addr, newRequest("new call"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)

	// The raw client sees the read-only event, then a new request of its
	// is rejected with 100 without running.
	ev := readResponse(t, rawRd, raw)
	if !ev.IsReadOnly() {
		t.Fatalf("raw client got flags %#x, want the read-only event", byte(ev.Header.Flags()))
	}
	ranBefore := bs.ran.Load()
	late := newRequest("late")
	late.Header.SetID(77)
	if _, err := raw.Write(protocol.AppendMessage(nil, late)); err != nil {
		t.Fatalf("write: %v", err)
	}
	m := readResponse(t, rawRd, raw)
	if m.Header.ID() != 77 || m.Header.Status() != protocol.StatusServerThreadpoolExhausted ||
		string(m.Payload) != "server shutting down" {
		t.Errorf("late request got id %d status %d %q, want 77, 100, server shutting down",
			m.Header.ID(), m.Header.Status(), m.Payload)
	}
	if bs.ran.Load() != ranBefore {
		t.Errorf("a request arriving during shutdown ran")
	}
	// Done with it: the raw client closes, as a dabb Pool would, which
	// ends the server's linger on this connection.
	_ = raw.Close()

	select {
	case err := <-shutdown:
		t.Fatalf("Shutdown returned %v before the in-flight handlers finished", err)
	default:
	}
	close(bs.release)
	for range inflight {
		if err := waitFor(t, results, "the in-flight calls"); err != nil {
			t.Errorf("in-flight call: %v", err)
		}
	}
	released := time.Now()
	if err := waitFor(t, shutdown, "Shutdown"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	// Every peer closed its connection: no linger to wait out.
	if d := time.Since(released); d > linger/10 {
		t.Errorf("Shutdown returned %v after the handlers finished; every peer had closed", d)
	}
	if err := waitFor(t, bs.served, "Serve to return"); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve returned %v, want ErrServerClosed", err)
	}
	bs.served <- ErrServerClosed // for the cleanup's check
	if err := bs.srv.Serve(listen(t)); !errors.Is(err, ErrServerClosed) {
		t.Errorf("Serve after Shutdown returned %v", err)
	}
}

func TestShutdownExpiredContext(t *testing.T) {
	bs := startBlockingServer(t, ServerConfig{})
	defer close(bs.release)
	p := newPool(t, Config{})
	errc := make(chan error, 1)
	go func() {
		_, err := p.RoundTrip(context.Background(), bs.addr, newRequest("stuck"))
		errc <- err
	}()
	waitFor(t, bs.entered, "the handler")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	start := time.Now()
	if err := bs.srv.Shutdown(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Shutdown = %v, want context.Canceled", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("Shutdown with an expired ctx took %v", d)
	}
	wantStatus(t, waitFor(t, errc, "the call"), protocol.StatusChannelInactive, false, false)
}

// TestShutdownAnswersRequestsAfterReadOnly is the regression test for a
// request written after the read-only event arrived: the server used to
// close the connection with the request unread, and the client reported
// status 35 ("may have acted") for a request that never ran. Now the
// server keeps reading until the client closes, and answers 100.
func TestShutdownAnswersRequestsAfterReadOnly(t *testing.T) {
	oneFrame := func(id uint64) []byte {
		req := newRequest(fmt.Sprint("late-", id))
		req.Header.SetID(id)
		return protocol.AppendMessage(nil, req)
	}
	tests := []struct {
		name   string
		ids    []uint64
		writes func(ids []uint64) [][]byte // what the client writes, in order
	}{
		{"one request", []uint64{11}, func(ids []uint64) [][]byte {
			return [][]byte{oneFrame(ids[0])}
		}},
		{"three requests in one write", []uint64{21, 22, 23}, func(ids []uint64) [][]byte {
			var b []byte
			for _, id := range ids {
				b = append(b, oneFrame(id)...)
			}
			return [][]byte{b}
		}},
		{"a request split across writes", []uint64{31}, func(ids []uint64) [][]byte {
			f := oneFrame(ids[0])
			return [][]byte{f[:10], f[10:20], f[20:]}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ran atomic.Int32
			ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
				ran.Add(1)
				echo(ctx, req, resp)
			}), ServerConfig{ShutdownLinger: longLinger})
			c, rd := serveRaw(t, ts.addr)
			shutdown := startShutdown(t, ts.srv)

			if ev := readResponse(t, rd, c); !ev.IsReadOnly() {
				t.Fatalf("got flags %#x, want the read-only event", byte(ev.Header.Flags()))
			}
			// No handler runs: without the linger, Shutdown would close the
			// connection now, with these requests unread.
			for _, b := range tc.writes(tc.ids) {
				if _, err := c.Write(b); err != nil {
					t.Fatalf("write after the read-only event: %v", err)
				}
			}
			for _, id := range tc.ids {
				m := readResponse(t, rd, c)
				if m.Header.ID() != id || m.Header.Status() != protocol.StatusServerThreadpoolExhausted ||
					string(m.Payload) != string(msgShuttingDown) {
					t.Fatalf("got id %d status %d %q, want id %d status 100 %q",
						m.Header.ID(), m.Header.Status(), m.Payload, id, msgShuttingDown)
				}
			}
			if n := ran.Load(); n != 0 {
				t.Errorf("%d requests sent after the read-only event ran", n)
			}
			select {
			case err := <-shutdown:
				t.Fatalf("Shutdown returned %v while the client kept its connection open", err)
			default:
			}
			closed := time.Now()
			_ = c.Close()
			if err := waitFor(t, shutdown, "Shutdown after the client closed"); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if d := time.Since(closed); d > longLinger/10 {
				t.Errorf("Shutdown returned %v after the last client closed", d)
			}
		})
	}
}

// TestShutdownLingerCap checks that a peer which ignores the read-only event
// and keeps its connection open is closed once ShutdownLinger has passed.
func TestShutdownLingerCap(t *testing.T) {
	const linger = 200 * time.Millisecond
	ts := startServer(t, echo, ServerConfig{ShutdownLinger: linger})
	c, _ := serveRaw(t, ts.addr)
	read := make(chan []byte, 1)
	go func() {
		_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
		b, err := io.ReadAll(c) // until the server closes
		if err != nil {
			t.Errorf("read until the server closes: %v", err)
		}
		read <- b
	}()

	start := time.Now()
	if err := ts.srv.Shutdown(testCtx(t)); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if d := time.Since(start); d < linger || d > linger+5*time.Second {
		t.Errorf("Shutdown took %v, want about the %v linger", d, linger)
	}
	got := waitFor(t, read, "the server to close the connection")
	if want := protocol.AppendReadOnly(nil, 1)[:3]; !bytes.HasPrefix(got, want) {
		t.Errorf("the server sent % x before closing, want the read-only event (% x...)", got, want)
	}
}

// TestShutdownPoolsCloseConnections checks the client's side: a Pool closes
// a connection that got the read-only event once no call is pending on it
// (at once when idle, after the last answer when busy), so Shutdown returns
// as soon as its handlers are done, without waiting out the linger.
func TestShutdownPoolsCloseConnections(t *testing.T) {
	const pools, connsPerPool = 2, 2
	tests := []struct {
		name string
		busy bool // one call per pool is running when Shutdown starts
	}{
		{"idle", false},
		{"busy", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			l := newWatchListener(t)
			entered, release := make(chan struct{}, pools), make(chan struct{})
			ts := startServerOn(t, l, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
				if string(req.Payload) == "block" {
					entered <- struct{}{}
					select {
					case <-release:
					case <-ctx.Done():
					}
				}
				echo(ctx, req, resp)
			}), ServerConfig{ShutdownLinger: longLinger})
			readOnly := make(chan string, pools*connsPerPool)
			ps := make([]*Pool, pools)
			for i := range ps {
				ps[i] = newPool(t, Config{ConnsPerAddr: connsPerPool, OnReadOnly: func(a string) { readOnly <- a }})
				// Two calls start a dial for each slot.
				for range connsPerPool {
					resp, err := ps[i].RoundTrip(testCtx(t), ts.addr, newRequest("warm"))
					if err != nil {
						t.Fatalf("warm-up: %v", err)
					}
					ps[i].Release(resp)
				}
			}
			l.waitServing(t, pools*connsPerPool)

			calls := make(chan error, pools)
			if tc.busy {
				ctx := testCtx(t)
				for _, p := range ps {
					go func() {
						resp, err := p.RoundTrip(ctx, ts.addr, newRequest("block"))
						if err == nil {
							p.Release(resp)
						}
						calls <- err
					}()
				}
				for range pools {
					waitFor(t, entered, "the blocking handlers")
				}
			}
			shutdown := startShutdown(t, ts.srv)
			for range pools {
				waitFor(t, readOnly, "OnReadOnly")
			}
			if tc.busy {
				for i, p := range ps {
					if n := p.pendingLen(ts.addr); n != 1 {
						t.Errorf("pool %d: %d calls pending on read-only connections, want 1", i, n)
					}
				}
				close(release)
				for range pools {
					// Had the client closed with the call pending, it would
					// get status 35 here.
					if err := waitFor(t, calls, "the blocked calls"); err != nil {
						t.Errorf("call in flight across Shutdown: %v", err)
					}
				}
			}
			released := time.Now()
			for range pools * connsPerPool {
				waitFor(t, l.peerGone, "a Pool to close its read-only connection")
			}
			if err := waitFor(t, shutdown, "Shutdown"); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if d := time.Since(released); d > longLinger/10 {
				t.Errorf("Shutdown returned %v after the last call; the Pools had closed every connection", d)
			}
			for i, p := range ps {
				if !p.ReadOnly(ts.addr) {
					t.Errorf("pool %d: ReadOnly = false after the event", i)
				}
				e := (*p.eps.Load())[ts.addr]
				for j := range e.slots {
					if c := e.slots[j].Load(); c != nil && !c.isClosed() {
						t.Errorf("pool %d: connection %d to the read-only address is still open", i, j)
					}
				}
			}
			if !tc.busy {
				close(release)
			}
		})
	}
}

// TestShutdownCallsNeverAmbiguous runs calls in a tight loop across
// Shutdown, several rounds: every call must succeed, be rejected by the
// server with 100 (not run), or fail locally with 35 wrapping ErrNotSent
// (never sent). A 35 without ErrNotSent ("the server may have acted") for a
// call the server never ran is the bug this guards against. With instant
// handlers nothing holds Shutdown back once the read-only event is out,
// which is when a close that does not wait for the clients loses requests.
func TestShutdownCallsNeverAmbiguous(t *testing.T) {
	const callers = 16
	rounds := []time.Duration{20 * time.Millisecond, 20 * time.Millisecond, 0, 0, 0, 0}
	for round, cost := range rounds {
		t.Run(fmt.Sprintf("round-%d-handler-%v", round, cost), func(t *testing.T) {
			l := newWatchListener(t)
			// busy closes once a few waves of calls reached the handler.
			var entered atomic.Int32
			busy := make(chan struct{})
			ts := startServerOn(t, l, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
				if entered.Add(1) == 3*callers {
					close(busy)
				}
				if cost > 0 {
					work := time.NewTimer(cost) // what a call costs
					defer work.Stop()
					select {
					case <-work.C:
					case <-ctx.Done():
					}
				}
				echo(ctx, req, resp)
			}), ServerConfig{ShutdownLinger: longLinger})
			p := newPool(t, Config{ConnsPerAddr: 2})
			ctx := testCtx(t)
			for range 2 { // start a dial for each slot
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest("warm"))
				if err != nil {
					t.Fatalf("warm-up: %v", err)
				}
				p.Release(resp)
			}
			l.waitServing(t, 2)

			var ok, rejected, notSentN, bad atomic.Int64
			stop := make(chan struct{})
			var wg sync.WaitGroup
			errs := make(chan error, callers)
			for g := range callers {
				wg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						want := fmt.Sprintf("call-%d-%d", g, i)
						resp, err := p.RoundTrip(ctx, ts.addr, newRequest(want))
						var pe *protocol.Error
						switch {
						case err == nil:
							got := string(resp.Payload)
							p.Release(resp)
							if got != want {
								bad.Add(1)
								errs <- fmt.Errorf("call %s got %q", want, got)
								return
							}
							ok.Add(1)
						case errors.As(err, &pe) && pe.Remote && pe.Status == protocol.StatusServerThreadpoolExhausted:
							rejected.Add(1)
						case errors.As(err, &pe) && !pe.Remote && pe.Status == protocol.StatusChannelInactive &&
							errors.Is(err, ErrNotSent):
							notSentN.Add(1)
						default:
							bad.Add(1)
							errs <- fmt.Errorf("call %s: %w", want, err)
							return
						}
					}
				})
			}
			waitFor(t, busy, "the calls to reach the handler")
			if ok.Load() == 0 {
				t.Errorf("no call succeeded before Shutdown")
			}
			start := time.Now()
			if err := ts.srv.Shutdown(ctx); err != nil {
				t.Errorf("Shutdown: %v", err)
			}
			if d := time.Since(start); d > longLinger/10 {
				t.Errorf("Shutdown took %v with only Pools as peers", d)
			}
			close(stop)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
			t.Logf("ok %d, rejected with 100 %d, not sent %d, ambiguous %d",
				ok.Load(), rejected.Load(), notSentN.Load(), bad.Load())
			if bad.Load() != 0 {
				t.Errorf("%d calls failed in a way that says the server may have acted", bad.Load())
			}
		})
	}
}

// gateListener is a TCP listener whose first Accept waits for gate: until
// then, dialled connections wait in the operating system's accept queue.
type gateListener struct {
	*net.TCPListener
	gate chan struct{}
}

func (l *gateListener) Accept() (net.Conn, error) {
	<-l.gate
	return l.TCPListener.Accept()
}

// A connection still in the accept queue when Shutdown begins, whose
// client has already sent a request, is accepted and answered 100 ("not
// run, safe to retry") with the read-only event, instead of being reset by
// the operating system when the listener closes (which a client reports as
// 35, "may have acted"). Nothing runs.
func TestShutdownDrainsAcceptQueue(t *testing.T) {
	l := listen(t).(*net.TCPListener)
	gl := &gateListener{TCPListener: l, gate: make(chan struct{})}
	var ran atomic.Int32
	srv := NewServer(HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		ran.Add(1)
	}), ServerConfig{Logger: quietLogger(), ShutdownLinger: longLinger})
	served := make(chan error, 1)
	go func() { served <- srv.Serve(gl) }()
	t.Cleanup(func() { _ = srv.Close() })

	c := dialRaw(t, l.Addr().String()) // queued: Serve waits at the gate
	req := newRequest("queued")
	req.Header.SetID(7)
	if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write: %v", err)
	}
	done := startShutdown(t, srv)
	eventually(t, "Shutdown to begin", func() bool { return srv.current() != serving })
	close(gl.gate)

	rd := protocol.NewReader(bufio.NewReader(c), 0)
	sawReadOnly, answered := false, false
	for !answered {
		m := readResponse(t, rd, c)
		switch {
		case m.IsReadOnly():
			sawReadOnly = true
		case m.Header.Flags().IsEvent():
		case m.Header.ID() == 7:
			answered = true
			if got := m.Header.Status(); got != protocol.StatusServerThreadpoolExhausted {
				t.Fatalf("the queued request got status %d (%q), want 100", got, m.Payload)
			}
		}
	}
	if !sawReadOnly {
		t.Errorf("the answer to the queued request came before the read-only event")
	}
	_ = c.Close() // a dabb client closes once its last call is answered
	if err := waitFor(t, done, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if err := waitFor(t, served, "Serve"); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v, want ErrServerClosed", err)
	}
	if n := ran.Load(); n != 0 {
		t.Errorf("the handler ran %d times during Shutdown, want 0", n)
	}
}

// TestConcurrentShutdowns: two Shutdowns waiting for the same handler
// both return once it does (the idle signal reaches both).
func TestConcurrentShutdowns(t *testing.T) {
	bs := startBlockingServer(t, ServerConfig{ShutdownLinger: 50 * time.Millisecond})
	p := newPool(t, Config{ConnsPerAddr: 1})
	called := make(chan struct{})
	go func() {
		defer close(called)
		if resp, err := p.RoundTrip(context.Background(), bs.addr, newRequest("x")); err == nil {
			p.Release(resp)
		}
	}()
	waitFor(t, bs.entered, "the handler")
	errc := make(chan error, 2)
	for range 2 {
		go func() { errc <- bs.srv.Shutdown(testCtx(t)) }()
	}
	waitBlockedIn(t, "transport.(*Server).Shutdown", 2)
	close(bs.release)
	for range 2 {
		if err := waitFor(t, errc, "a Shutdown to return"); err != nil {
			t.Errorf("Shutdown = %v, want nil: the only handler returned", err)
		}
	}
	<-called
}

// waitBlockedIn waits until n goroutines are blocked in a select or on a
// channel inside fn (read from the goroutine dump: there is no event to
// await for "parked").
func waitBlockedIn(t *testing.T, fn string, n int) {
	t.Helper()
	deadline := time.Now().Add(defaultTestTimeout)
	buf := make([]byte, 1<<20)
	for {
		dump := string(buf[:runtime.Stack(buf, true)])
		got := 0
		for _, g := range strings.Split(dump, "\n\n") {
			first, _, _ := strings.Cut(g, "\n")
			if (strings.Contains(first, "[select") || strings.Contains(first, "[chan receive")) && strings.Contains(g, fn) {
				got++
			}
		}
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines blocked in %s, want %d", got, fn, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestReadOnlyBeforeShuttingDownAnswers: from the moment Shutdown begins,
// requests are answered 100 ("shutting down"); the read-only event comes
// first on every connection, so a client knows why before it sees one and
// does not take the instance for an overloaded one.
func TestReadOnlyBeforeShuttingDownAnswers(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{ShutdownLinger: longLinger})
	c, rd := serveRaw(t, ts.addr)
	stop := make(chan struct{})
	wrote := make(chan struct{})
	go func() { // a client calling back to back, Shutdown or not
		defer close(wrote)
		for id := uint64(100); ; id++ {
			select {
			case <-stop:
				return
			default:
			}
			req := newRequest("x")
			req.Header.SetID(id)
			if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
				return
			}
			time.Sleep(200 * time.Microsecond) // the client's pace
		}
	}()
	readResponse(t, rd, c) // calls are flowing
	shutdown := startShutdown(t, ts.srv)
	for {
		m := readResponse(t, rd, c)
		if m.IsReadOnly() {
			break
		}
		if m.Header.Status() == protocol.StatusServerThreadpoolExhausted {
			t.Fatalf("request %d was answered 100 (%q) before the read-only event", m.Header.ID(), m.Payload)
		}
	}
	close(stop)
	<-wrote
	_ = c.Close()
	if err := waitFor(t, shutdown, "Shutdown after the client closed"); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
