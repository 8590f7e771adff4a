package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// clientConnTo returns the pool's first connection to addr.
func clientConnTo(t *testing.T, p *Pool, addr string) *clientConn {
	t.Helper()
	e := (*p.eps.Load())[addr]
	if e == nil || e.slots[0].Load() == nil {
		t.Fatalf("the pool has no connection to %s", addr)
	}
	return e.slots[0].Load()
}

// grants returns how many callers took c's read token.
func grants(c *clientConn) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.tok.gen
}

// waitParked waits until c's read token is parked: the next call takes it.
func waitParked(t *testing.T, c *clientConn) {
	t.Helper()
	eventually(t, "the read token to be parked", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return c.tok.holder == tokParked
	})
}

func call1(t *testing.T, ctx context.Context, p *Pool, addr string, req *protocol.Message) *protocol.Message {
	t.Helper()
	resp, err := p.RoundTrip(ctx, addr, req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	return resp
}

// Sequential calls each read their own answer: after the first, every
// call takes the parked read token.
func TestCallerReadsOwnAnswer(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	// The first call waits for the reader goroutine, which parks the token
	// once the call has its answer.
	p.Release(call1(t, testCtx(t), p, ts.addr, newRequest("x")))
	waitParked(t, clientConnTo(t, p, ts.addr))
	const calls = 100
	for range calls {
		p.Release(call1(t, testCtx(t), p, ts.addr, newRequest("x")))
	}
	// Each call parks the token again for the next. The reader takes it
	// back after a quiet period, which a loaded machine may leave between
	// two calls; the call after that waits for the reader.
	if got := grants(clientConnTo(t, p, ts.addr)); got < calls*3/4 {
		t.Fatalf("%d of %d sequential calls read their own answer, want %d at least", got, calls, calls*3/4)
	}
}

// A caller whose budget ends in the middle of its answer's frame gives up
// with status 31 and sends the cancel event. The part of the frame already
// read stays for the next reader: the next call on the connection gets its
// own answer, and the late one is dropped.
func TestOwnReadDeadlineMidFrame(t *testing.T) {
	addr, conns := rawServer(t)
	p := newPool(t, Config{ConnsPerAddr: 1})
	results := make(chan error, 1)
	roundTrip := func(payload string, budget time.Duration) {
		go func() {
			req := newRequest(payload)
			req.Timeout = budget
			resp, err := p.RoundTrip(testCtx(t), addr, req)
			if err == nil && string(resp.Payload) != payload {
				err = errors.New("answer " + string(resp.Payload) + " to call " + payload)
			}
			if err == nil {
				p.Release(resp)
			}
			results <- err
		}()
	}
	roundTrip("first", 0)
	c := waitFor(t, conns, "the client's connection")
	frames := readFrames(c)
	req := nextFrame(t, frames, "the first request")
	writeResponse(t, c, req.Header.ID(), "first")
	if err := waitFor(t, results, "the first call"); err != nil {
		t.Fatalf("first call: %v", err)
	}
	waitParked(t, clientConnTo(t, p, addr))

	roundTrip("second", 300*time.Millisecond)
	req = nextFrame(t, frames, "the second request")
	var resp protocol.Message
	resp.Header.Init(protocol.MakeFlags(0, 22), protocol.StatusOK, req.Header.ID())
	resp.Payload = []byte("second")
	frame := protocol.AppendMessage(nil, &resp)
	if _, err := c.Write(frame[:10]); err != nil {
		t.Fatal(err)
	}
	err := waitFor(t, results, "the second call to time out")
	wantStatus(t, err, protocol.StatusServerTimeout, false, false)
	if grants(clientConnTo(t, p, addr)) == 0 {
		t.Fatal("the second call did not read its own answer")
	}
	cancel := nextFrame(t, frames, "the cancel event")
	if !cancel.IsCancel() || cancel.Header.ID() != req.Header.ID() {
		t.Fatalf("after the timeout the server read %v, want the cancel event of call %d", cancel.Header, req.Header.ID())
	}
	if _, err := c.Write(frame[10:]); err != nil {
		t.Fatal(err)
	}

	roundTrip("third", 0)
	req = nextFrame(t, frames, "the third request")
	writeResponse(t, c, req.Header.ID(), "third")
	if err := waitFor(t, results, "the third call"); err != nil {
		t.Fatalf("third call: %v", err)
	}
}

// A caller reading its own answer returns as soon as its context is
// cancelled, and the handler learns of it; the connection serves on.
func TestOwnReadCancelled(t *testing.T) {
	started := make(chan struct{}, 1)
	ended := make(chan error, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "wait" {
			started <- struct{}{}
			<-ctx.Done()
			ended <- ctx.Err()
			return
		}
		echo(ctx, req, resp)
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	p.Release(call1(t, testCtx(t), p, ts.addr, newRequest("warm")))
	waitParked(t, clientConnTo(t, p, ts.addr))
	before := grants(clientConnTo(t, p, ts.addr))
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() {
		<-started
		cancel()
	}()
	_, err := p.RoundTrip(ctx, ts.addr, newRequest("wait"))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled call: %v, want context.Canceled", err)
	}
	if grants(clientConnTo(t, p, ts.addr)) == before {
		t.Fatal("the cancelled call did not read its own answer")
	}
	if got := waitFor(t, ended, "the handler's context to end"); !errors.Is(got, context.Canceled) {
		t.Fatalf("the handler's context ended with %v", got)
	}
	resp := call1(t, testCtx(t), p, ts.addr, newRequest("after"))
	defer p.Release(resp)
	if string(resp.Payload) != "after" {
		t.Fatalf("the call after got %q", resp.Payload)
	}
}

// While one caller reads for its own answer, the answers of calls that
// joined the connection after it reach their callers: the reading caller
// hands them on.
func TestOwnReaderDeliversOthers(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "slow" {
			started <- struct{}{}
			<-release
		}
		echo(ctx, req, resp)
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	p.Release(call1(t, testCtx(t), p, ts.addr, newRequest("warm")))
	waitParked(t, clientConnTo(t, p, ts.addr))
	slow := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("slow"))
		if err == nil {
			p.Release(resp)
		}
		slow <- err
	}()
	waitFor(t, started, "the slow call to run")
	cc := clientConnTo(t, p, ts.addr)
	cc.mu.Lock()
	holder := cc.tok.holder
	cc.mu.Unlock()
	if holder != tokCaller {
		t.Fatalf("token holder %d while the slow call waits, want the caller (%d)", holder, tokCaller)
	}
	for range 5 {
		resp := call1(t, testCtx(t), p, ts.addr, newRequest("fast"))
		if string(resp.Payload) != "fast" {
			t.Fatalf("fast call got %q", resp.Payload)
		}
		p.Release(resp)
	}
	select {
	case err := <-slow:
		t.Fatalf("the slow call returned (%v) before it was released", err)
	default:
	}
	close(release)
	if err := waitFor(t, slow, "the slow call"); err != nil {
		t.Fatalf("slow call: %v", err)
	}
}

// An answer too large for the read buffer is read by the reader goroutine:
// the caller hands it the token and waits, and gets the whole answer.
func TestOwnReadLargeAnswer(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	p.Release(call1(t, testCtx(t), p, ts.addr, newRequest("warm")))
	big := bytes.Repeat([]byte("0123456789abcdef"), 8<<10) // 128 KiB
	for range 3 {
		resp := call1(t, testCtx(t), p, ts.addr, newRequest(string(big)))
		if !bytes.Equal(resp.Payload, big) {
			t.Fatalf("a %d-byte answer came back as %d bytes", len(big), len(resp.Payload))
		}
		p.Release(resp)
	}
	p.Release(call1(t, testCtx(t), p, ts.addr, newRequest("small")))
}

// A connection whose token is parked (no call waits) is read again soon:
// the pool sees its server close it well before a later call would.
func TestParkedConnectionSeesClose(t *testing.T) {
	addr, conns := rawServer(t)
	p := newPool(t, Config{ConnsPerAddr: 1})
	done := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(testCtx(t), addr, newRequest("x"))
		if err == nil {
			p.Release(resp)
		}
		done <- err
	}()
	c := waitFor(t, conns, "the client's connection")
	frames := readFrames(c)
	req := nextFrame(t, frames, "the request")
	writeResponse(t, c, req.Header.ID(), "x")
	if err := waitFor(t, done, "the call"); err != nil {
		t.Fatal(err)
	}
	cc := clientConnTo(t, p, addr)
	waitParked(t, cc)
	closed := time.Now()
	_ = c.Close()
	eventually(t, "the pool to see the close", cc.isClosed)
	if d := time.Since(closed); d > 250*time.Millisecond {
		t.Errorf("the pool saw the close after %v, want within a few token looks (%v each)", d, tokenLook)
	}
	if err := cc.closeErr(); !errors.Is(err, io.EOF) {
		t.Errorf("closed with %v, want EOF", err)
	}
}

// Over TLS too, a caller reads its own answer, and one that gives up at
// its budget leaves the connection readable: the calls after it work.
func TestOwnReadOverTLS(t *testing.T) {
	k := newPKI(t)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "slow" {
			<-ctx.Done()
			return
		}
		echo(ctx, req, resp)
	}), ServerConfig{TLS: k.serverTLS(k.server)})
	p := newPool(t, Config{TLS: k.clientTLS(k.client), ConnsPerAddr: 1})
	p.Release(call1(t, testCtx(t), p, ts.addr, newRequest("warm")))
	cc := clientConnTo(t, p, ts.addr)
	for i := range 3 {
		waitParked(t, cc)
		before := grants(cc)
		req := newRequest("slow")
		req.Timeout = 50 * time.Millisecond
		_, err := p.RoundTrip(testCtx(t), ts.addr, req)
		wantStatus(t, err, protocol.StatusServerTimeout, false, false)
		if grants(cc) == before {
			t.Fatalf("round %d: the call that timed out did not read its own answer", i)
		}
		resp := call1(t, testCtx(t), p, ts.addr, newRequest("after"))
		if string(resp.Payload) != "after" {
			t.Fatalf("round %d: the call after the timeout got %q", i, resp.Payload)
		}
		p.Release(resp)
	}
}

// A reader that delivered a burst of answers keeps the read token when no
// call is left: the next caller waits for the reader rather than reading.
// A lone answer parks the token again, for the next call to take.
func TestReaderKeepsTokenAfterBurst(t *testing.T) {
	addr, conns := rawServer(t)
	p := newPool(t, Config{ConnsPerAddr: 1})
	results := make(chan error, 2)
	roundTrip := func(payload string) {
		go func() {
			resp, err := p.RoundTrip(testCtx(t), addr, newRequest(payload))
			if err == nil && string(resp.Payload) != payload {
				err = errors.New("answer " + string(resp.Payload) + " to call " + payload)
			}
			if err == nil {
				p.Release(resp)
			}
			results <- err
		}()
	}
	roundTrip("a")
	roundTrip("b")
	c := waitFor(t, conns, "the client's connection")
	frames := readFrames(c)
	var burst []byte
	for range 2 {
		req := nextFrame(t, frames, "a request of the burst")
		var resp protocol.Message
		resp.Header.Init(protocol.MakeFlags(0, 22), protocol.StatusOK, req.Header.ID())
		resp.Payload = req.Payload
		burst = protocol.AppendMessage(burst, &resp)
	}
	if _, err := c.Write(burst); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := waitFor(t, results, "a call of the burst"); err != nil {
			t.Fatalf("call of the burst: %v", err)
		}
	}
	cc := clientConnTo(t, p, addr)
	eventually(t, "the reader to find no call waiting after the burst", func() bool {
		cc.mu.Lock()
		defer cc.mu.Unlock()
		return cc.tok.kept == 1
	})
	cc.mu.Lock()
	holder := cc.tok.holder
	cc.mu.Unlock()
	if holder != tokReader {
		t.Fatalf("token holder %d after a burst, want the reader (%d)", holder, tokReader)
	}

	roundTrip("alone")
	req := nextFrame(t, frames, "the lone request")
	writeResponse(t, c, req.Header.ID(), "alone")
	if err := waitFor(t, results, "the lone call"); err != nil {
		t.Fatalf("lone call: %v", err)
	}
	if g := grants(cc); g != 0 {
		t.Fatalf("%d callers took the token after a burst, want 0", g)
	}
	waitParked(t, cc)

	roundTrip("next")
	req = nextFrame(t, frames, "the next request")
	writeResponse(t, c, req.Header.ID(), "next")
	if err := waitFor(t, results, "the next call"); err != nil {
		t.Fatalf("next call: %v", err)
	}
	if g := grants(cc); g != 1 {
		t.Fatalf("%d callers took the token after a lone answer, want 1", g)
	}
}
