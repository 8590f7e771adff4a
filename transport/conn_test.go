package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func TestConnectionLost(t *testing.T) {
	l := listen(t)
	addr := l.Addr().String()
	bs := &blockingServer{entered: make(chan string, 100), release: make(chan struct{})}
	bs.testServer = startServerOn(t, l, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		bs.entered <- string(req.Payload)
		<-ctx.Done()
	}), ServerConfig{})
	p := newPool(t, Config{})

	const calls = 8
	errs := make(chan error, calls)
	for i := range calls {
		go func() {
			req := newRequest(fmt.Sprint(i))
			req.Timeout = time.Minute // must fail long before this
			_, err := p.RoundTrip(context.Background(), addr, req)
			errs <- err
		}()
	}
	for range calls {
		waitFor(t, bs.entered, "the handlers")
	}
	killed := time.Now()
	if err := bs.srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for range calls {
		err := waitFor(t, errs, "a pending call to fail")
		wantStatus(t, err, protocol.StatusChannelInactive, false, false)
	}
	if d := time.Since(killed); d > 5*time.Second {
		t.Errorf("pending calls failed %v after the server died", d)
	}
	if n := p.pendingLen(addr); n != 0 {
		t.Errorf("pending table holds %d calls", n)
	}
	// Close does not wait for the server's goroutines: an idle
	// connection's closing may reach the pool's reader later than the
	// calls' failures; a call on it then would fail as well.
	waitNoConns(t, p, "the pool to see every connection closed")

	// The server comes back on the same address: the next call redials.
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("listen again on %s: %v", addr, err)
	}
	startServerOn(t, l2, echo, ServerConfig{})
	resp, err := p.RoundTrip(testCtx(t), addr, newRequest("back"))
	if err != nil {
		t.Fatalf("RoundTrip after the server came back: %v", err)
	}
	if string(resp.Payload) != "back" {
		t.Errorf("payload = %q", resp.Payload)
	}
	p.Release(resp)
}

func TestSilentServerClosed(t *testing.T) {
	addr, conns := rawServer(t)
	const interval = 50 * time.Millisecond
	p := newPool(t, Config{HeartbeatInterval: interval})

	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := p.RoundTrip(context.Background(), addr, newRequest("nobody answers"))
		errc <- err
	}()
	c := waitFor(t, conns, "the connection")
	defer c.Close()
	// Read (and never answer) everything the client sends.
	read := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(c)
		read <- b
	}()

	err := waitFor(t, errc, "the client to give up on the silent server")
	elapsed := time.Since(start)
	wantStatus(t, err, protocol.StatusChannelInactive, false, false)
	if elapsed < 2*interval {
		t.Errorf("closed after %v, before 3 silent intervals of %v", elapsed, interval)
	}
	got := waitFor(t, read, "the client to close its side")
	if !bytes.Contains(got, []byte{0xda, 0xbb, 0xe2, 0x00}) {
		t.Errorf("the client sent no heartbeat before closing; it sent % x", got)
	}
}

func TestClientAnswersHeartbeats(t *testing.T) {
	const interval = 20 * time.Millisecond
	ts := startServer(t, echo, ServerConfig{HeartbeatInterval: interval})
	var d countingDial
	p := newPool(t, Config{ConnsPerAddr: 1, Dial: d.dial, HeartbeatInterval: time.Hour})
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("a"))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	p.Release(resp)
	// Idle for many server intervals: the server's heartbeats are
	// answered, so it keeps the connection.
	time.Sleep(10 * interval) // the idle period is what is tested
	resp, err = p.RoundTrip(testCtx(t), ts.addr, newRequest("b"))
	if err != nil {
		t.Fatalf("RoundTrip after idling: %v", err)
	}
	p.Release(resp)
	if got := d.n.Load(); got != 1 {
		t.Errorf("%d dials: the idle connection was dropped", got)
	}
}

func TestReadOnlyFromRawServer(t *testing.T) {
	addr, conns := rawServer(t)
	var fired atomic.Int32
	readOnly := make(chan string, 4)
	p := newPool(t, Config{ConnsPerAddr: 1, OnReadOnly: func(a string) {
		fired.Add(1)
		readOnly <- a
	}})
	errc := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(context.Background(), addr, newRequest("pending"))
		if err == nil {
			p.Release(resp)
		}
		errc <- err
	}()
	c := waitFor(t, conns, "the connection")
	defer c.Close()
	var req protocol.Message
	rd := protocol.NewReader(bufioReader(c), 0)
	if err := rd.Read(&req); err != nil {
		t.Fatalf("read the request: %v", err)
	}
	// Send read-only twice: OnReadOnly fires once.
	ev := protocol.AppendReadOnly(nil, 1)
	ev = protocol.AppendReadOnly(ev, 2)
	if _, err := c.Write(ev); err != nil {
		t.Fatalf("write read-only: %v", err)
	}
	if got := waitFor(t, readOnly, "OnReadOnly"); got != addr {
		t.Errorf("OnReadOnly(%q), want %q", got, addr)
	}
	if !p.ReadOnly(addr) {
		t.Errorf("ReadOnly(%s) = false after the event", addr)
	}
	_, err := p.RoundTrip(testCtx(t), addr, newRequest("new call"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)

	// The pending call still gets its answer on the draining connection.
	var resp protocol.Message
	resp.Header.Init(protocol.MakeFlags(0, 22), protocol.StatusOK, req.Header.ID())
	resp.Payload = []byte("late but fine")
	if _, err := c.Write(protocol.AppendMessage(nil, &resp)); err != nil {
		t.Fatalf("write response: %v", err)
	}
	if err := waitFor(t, errc, "the pending call"); err != nil {
		t.Errorf("pending call on a read-only connection: %v", err)
	}
	if n := fired.Load(); n != 1 {
		t.Errorf("OnReadOnly fired %d times, want 1", n)
	}
}

// TestCancelOnDrainingConnection: the last call on a read-only connection
// is given up; its cancel still goes out before the client closes.
func TestCancelOnDrainingConnection(t *testing.T) {
	addr, conns := rawServer(t)
	p := newPool(t, Config{ConnsPerAddr: 1})
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := p.RoundTrip(ctx, addr, newRequest("pending"))
		errc <- err
	}()
	c := waitFor(t, conns, "the connection")
	defer c.Close()
	frames := readFrames(c)
	req := nextFrame(t, frames, "the request")
	if _, err := c.Write(protocol.AppendReadOnly(nil, 1)); err != nil {
		t.Fatal(err)
	}
	eventually(t, "the read-only event to arrive", func() bool { return p.ReadOnly(addr) })
	cancel()
	wantStatus(t, waitFor(t, errc, "the call"), protocol.StatusClientError, false, false)
	m := nextFrame(t, frames, "the cancel")
	if !m.IsCancel() || m.Header.ID() != req.Header.ID() {
		t.Fatalf("got flags %#02x id %d, want the cancel of call %d", byte(m.Header.Flags()), m.Header.ID(), req.Header.ID())
	}
	// Then the client closes the drained connection.
	if m := nextFrameOrEOF(t, frames, "the client to close"); m != nil {
		t.Fatalf("got another frame (flags %#02x, id %d) instead of the close", byte(m.Header.Flags()), m.Header.ID())
	}
}

// TestConnState: a connection's state only moves up (open, retiring,
// readOnly, closed), each state refuses new calls with its own reason, a
// draining connection closes itself after its last call, and close keeps
// its first error.
func TestConnState(t *testing.T) {
	p := newPool(t, Config{})
	e, err := p.endpoint("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	newConn := func() *clientConn {
		a, b := net.Pipe()
		t.Cleanup(func() { a.Close(); b.Close() })
		return newClientConn(e, a)
	}
	refused := func(c *clientConn, want string) {
		t.Helper()
		_, err := c.register(99, &call{ch: make(chan *protocol.Message, 1)}, true)
		pe := wantStatus(t, err, protocol.StatusChannelInactive, false, true)
		if !strings.Contains(pe.Msg, want) {
			t.Errorf("register in state %d: %q, want it to say %q", c.load(), pe.Msg, want)
		}
	}

	c := newConn()
	if c.load() != connOpen || !c.usable() {
		t.Fatalf("a new connection is in state %d, usable %v; want open", c.load(), c.usable())
	}
	cl := &call{ch: make(chan *protocol.Message, 1)}
	if _, err := c.register(1, cl, false); err != nil {
		t.Fatalf("register on an open connection: %v", err)
	}
	for _, step := range []struct {
		name string
		to   connState
		want connState
		says string
	}{
		{"forgotten", connRetiring, connRetiring, "left the instance list"},
		{"read-only outranks forgotten", connReadOnly, connReadOnly, "read-only"},
		{"forgotten again stays read-only", connRetiring, connReadOnly, "read-only"},
	} {
		t.Run(step.name, func(t *testing.T) {
			c.drain(step.to)
			if got := c.load(); got != step.want {
				t.Fatalf("state %d, want %d", got, step.want)
			}
			if c.usable() {
				t.Error("a draining connection is usable")
			}
			refused(c, step.says)
		})
	}

	first, second := errors.New("first"), errors.New("second")
	c.close(first)
	c.close(second)
	if !c.isClosed() {
		t.Fatalf("state %d after close, want closed", c.load())
	}
	if err := c.closeErr(); err != first {
		t.Errorf("closeErr = %v, want the first close's error", err)
	}
	if m := <-cl.ch; m != nil {
		t.Errorf("the pending call got %v at close, want nil", m)
	}
	c.drain(connReadOnly)
	if !c.isClosed() {
		t.Errorf("state %d after draining a closed connection, want closed", c.load())
	}
	refused(c, "connection closed")

	t.Run("drained closes itself", func(t *testing.T) {
		c := newConn()
		c.drain(connReadOnly)
		if !c.isClosed() || !errors.Is(c.closeErr(), ErrClosed) {
			t.Errorf("a read-only connection with no call is in state %d (%v), want closed with ErrClosed", c.load(), c.closeErr())
		}
	})
}

// callRawServer starts a call from a pool to a raw server and returns the
// server's side of the connection once the request is read, with its
// header, the pool and the call's result.
func callRawServer(t *testing.T) (c net.Conn, req protocol.Header, p *Pool, errc <-chan error) {
	t.Helper()
	addr, conns := rawServer(t)
	p = newPool(t, Config{Serializations: func(id byte) bool { return id == 22 }})
	result := make(chan error, 1)
	go func() {
		_, err := p.RoundTrip(testCtx(t), addr, newRequest("hello"))
		result <- err
	}()
	c = waitFor(t, conns, "the client's connection")
	if _, err := io.ReadFull(c, req[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, c, int64(req.BodyLen())); err != nil {
		t.Fatal(err)
	}
	return c, req, p, result
}

// TestForeignPeerNamed: a peer that answers in a serialization dabb does
// not have (a Dubbo provider answering 40 in hessian2) is not a dabb
// server. The call fails with a local 50 that names the serialization and
// says so, and the connection closes.
func TestForeignPeerNamed(t *testing.T) {
	c, h, p, errc := callRawServer(t)
	// As a Dubbo provider answers a body it could not decode.
	answer := protocol.AppendForeignError(nil, h.ID(), protocol.Hessian2, protocol.StatusBadRequest, "Decode rpc invocation failed")
	if _, err := c.Write(answer); err != nil {
		t.Fatal(err)
	}
	err := waitFor(t, errc, "the call")
	pe := wantStatus(t, err, protocol.StatusBadResponse, false, false)
	if !strings.Contains(pe.Msg, "not a dabb server") || !strings.Contains(pe.Msg, "hessian2 (id 2)") {
		t.Fatalf("err = %v; want it to say the peer is not a dabb server and name hessian2 (id 2)", err)
	}
	waitNoConns(t, p, "the connection to the foreign peer to close")
}

// TestForeignRequestFromPeer: a peer that sends a request in a
// serialization dabb does not have (a Dubbo consumer that dialled a dabb
// client's connection) is not a dabb server either. The connection
// closes, and the call pending on it fails as a lost connection whose
// cause names the serialization.
func TestForeignRequestFromPeer(t *testing.T) {
	c, _, p, errc := callRawServer(t)
	body := []byte{'N'} // a hessian2 null, as a body the client never decodes
	var req protocol.Header
	req.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, protocol.Hessian2), 0, 7)
	req.SetBodyLen(uint32(len(body)))
	if _, err := c.Write(append(req[:], body...)); err != nil {
		t.Fatal(err)
	}
	err := waitFor(t, errc, "the call")
	wantStatus(t, err, protocol.StatusChannelInactive, false, false)
	if msg := err.Error(); !strings.Contains(msg, "not a dabb server") || !strings.Contains(msg, "hessian2 (id 2)") {
		t.Fatalf("err = %v; want its cause to say the peer is not a dabb server and name hessian2 (id 2)", err)
	}
	waitNoConns(t, p, "the connection to the foreign peer to close")
}

// TestGoAwayFromRawServer: after the go-away event, a call the server
// leaves unanswered when it closes the connection fails not sent (the
// server runs nothing after go-away), and a new call goes over a new
// connection.
func TestGoAwayFromRawServer(t *testing.T) {
	c, _, p, errc := callRawServer(t)
	if _, err := c.Write(protocol.AppendGoAway(nil, 1)); err != nil {
		t.Fatalf("write go-away: %v", err)
	}
	// The pool stops choosing the connection before the server closes it.
	eventually(t, "the pool to stop choosing the connection", func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		for cc := range p.conns {
			if cc.usable() {
				return false
			}
		}
		return true
	})
	_ = c.Close()
	err := waitFor(t, errc, "the pending call")
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	if !errors.Is(err, ErrGoneAway) {
		t.Errorf("err = %v, want one wrapping ErrGoneAway", err)
	}
}
