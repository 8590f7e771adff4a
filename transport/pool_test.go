package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
)

func TestRoundTrip(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	p := newPool(t, Config{})
	tests := []struct {
		name        string
		payload     string
		attachments map[string]string
	}{
		{"empty", "", nil},
		{"small", "hello", nil},
		{"attachments", "with attachments", map[string]string{"trace-id": "abc", protocol.AttachIdempotencyKey: "k1"}},
		{"binary", "\x00\x01\xff\xfe", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			req := newRequest(tc.payload)
			req.Attachments = tc.attachments
			resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
			if err != nil {
				t.Fatalf("RoundTrip: %v", err)
			}
			defer p.Release(resp)
			if got := string(resp.Payload); got != tc.payload {
				t.Errorf("payload = %q, want %q", got, tc.payload)
			}
			if resp.Header.Status() != protocol.StatusOK {
				t.Errorf("status = %d, want OK", resp.Header.Status())
			}
			if resp.Header.ID() != req.Header.ID() {
				t.Errorf("response id %d, request id %d", resp.Header.ID(), req.Header.ID())
			}
			if f := resp.Header.Flags(); f.IsRequest() || f.Serialization() != 22 {
				t.Errorf("response flags %#x, want a response with serialization 22", byte(f))
			}
			// The key comes back in its own field, the rest in the map.
			got := maps.Clone(resp.Attachments)
			if resp.IdempotencyKey != "" {
				if got == nil {
					got = map[string]string{}
				}
				got[protocol.AttachIdempotencyKey] = resp.IdempotencyKey
			}
			if !maps.Equal(got, tc.attachments) {
				t.Errorf("attachments = %v, key %q; want %v", resp.Attachments, resp.IdempotencyKey, tc.attachments)
			}
			if _, inMap := resp.Attachments[protocol.AttachIdempotencyKey]; inMap {
				t.Errorf("the idempotency key was decoded into the map: %v", resp.Attachments)
			}
		})
	}
}

func TestConcurrentCalls(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	p := newPool(t, Config{})
	const goroutines, total = 64, 10000
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < total; i += goroutines {
				want := fmt.Sprintf("call-%d", i)
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest(want))
				if err != nil {
					errs <- fmt.Errorf("call %d: %w", i, err)
					return
				}
				got := string(resp.Payload)
				p.Release(resp)
				if got != want {
					errs <- fmt.Errorf("call %d got the response %q", i, got)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := p.pendingLen(ts.addr); n != 0 {
		t.Errorf("pending table holds %d calls after all returned", n)
	}
}

func TestOneWay(t *testing.T) {
	got := make(chan string, 1)
	ts := startServer(t, HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		got <- string(req.Payload)
		resp.Payload = []byte("never sent")
	}), ServerConfig{})
	p := newPool(t, Config{})
	req := newRequest("fire and forget")
	req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest, 22))
	resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
	if resp != nil || err != nil {
		t.Fatalf("one-way RoundTrip = %v, %v; want nil, nil", resp, err)
	}
	if v := waitFor(t, got, "the one-way request"); v != "fire and forget" {
		t.Errorf("handler got %q", v)
	}
	// The connection carries no stray response: a two-way call after it
	// gets its own answer.
	resp2, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("next"))
	if err != nil {
		t.Fatalf("RoundTrip after one-way: %v", err)
	}
	defer p.Release(resp2)
	<-got
	if string(resp2.Payload) != "never sent" {
		t.Errorf("payload = %q", resp2.Payload)
	}
}

func TestBigPayload(t *testing.T) {
	const limit = 1 << 20
	ts := startServer(t, echo, ServerConfig{MaxBody: limit})
	p := newPool(t, Config{MaxBody: limit})
	// The request body is payload + 2+9+5+1 bytes of header fields.
	payload := bytes.Repeat([]byte("0123456789abcdef"), (limit-64)/16)
	req := newRequest(string(payload))
	resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
	if err != nil {
		t.Fatalf("RoundTrip near the limit: %v", err)
	}
	if !bytes.Equal(resp.Payload, payload) {
		t.Errorf("payload of %d bytes came back as %d bytes", len(payload), len(resp.Payload))
	}
	p.Release(resp)

	t.Run("request over the client limit", func(t *testing.T) {
		small := newPool(t, Config{MaxBody: 1 << 10})
		_, err := small.RoundTrip(testCtx(t), ts.addr, newRequest(strings.Repeat("x", 4<<10)))
		wantStatus(t, err, protocol.StatusClientError, false, true)
		if !errors.Is(err, protocol.ErrBodyTooLarge) {
			t.Errorf("err = %v, want it to wrap protocol.ErrBodyTooLarge", err)
		}
	})

	t.Run("request over the server limit", func(t *testing.T) {
		// The client allows what the server refuses: the server drops the
		// body and answers 40 on the same connection.
		var dials atomic.Int32
		big := newPool(t, Config{ConnsPerAddr: 1, Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}})
		over := bytes.Repeat([]byte("x"), limit+1)
		for range 2 {
			_, err := big.RoundTrip(testCtx(t), ts.addr, newRequest(string(over)))
			pe := wantStatus(t, err, protocol.StatusBadRequest, true, false)
			if !strings.Contains(pe.Msg, "body too large") {
				t.Errorf("status 40 says %q, want it to name the body's size", pe.Msg)
			}
			resp, err := big.RoundTrip(testCtx(t), ts.addr, newRequest("next"))
			if err != nil {
				t.Fatalf("RoundTrip after the oversized request: %v", err)
			}
			if string(resp.Payload) != "next" {
				t.Errorf("payload = %q", resp.Payload)
			}
			big.Release(resp)
		}
		// One connection for requests of LargeMessage or more, one for the
		// others, each dialed once (a call may go over the other while
		// its own dials in the background).
		wait.Until(t, defaultTestTimeout, time.Millisecond, "both connections dialed", func() bool { return dials.Load() >= 2 })
		if n := dials.Load(); n != 2 {
			t.Errorf("the pool dialed %d times, want 2: the oversized requests cost their connection", n)
		}
	})

	// A handler answering "big" replies with 4 KiB, others echo; "block"
	// waits for release, so a call is in flight on the same connection.
	entered, release := make(chan struct{}, 1), make(chan struct{})
	bigReply := func(t *testing.T, cfg ServerConfig) string {
		return startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
			switch string(req.Payload) {
			case "big":
				resp.Payload = append(resp.Payload[:0], strings.Repeat("x", 4<<10)...)
			case "block":
				entered <- struct{}{}
				<-release
				fallthrough
			default:
				resp.Payload = append(resp.Payload[:0], req.Payload...)
			}
		}), cfg).addr
	}
	// oneOversized makes a call whose answer is too large while another
	// call waits on the same connection, and checks that only the first
	// fails, with status, and that the connection was not redialed.
	oneOversized := func(t *testing.T, addr string, maxBody uint32, status protocol.Status, remote bool) *protocol.Error {
		var dials atomic.Int32
		p := newPool(t, Config{ConnsPerAddr: 1, MaxBody: maxBody, Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			dials.Add(1)
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}})
		blocked := make(chan error, 1)
		go func() {
			resp, err := p.RoundTrip(testCtx(t), addr, newRequest("block"))
			if err == nil {
				p.Release(resp)
			}
			blocked <- err
		}()
		waitFor(t, entered, "the blocked call")
		_, err := p.RoundTrip(testCtx(t), addr, newRequest("big"))
		pe := wantStatus(t, err, status, remote, false)
		release <- struct{}{}
		if err := waitFor(t, blocked, "the call sharing the connection"); err != nil {
			t.Fatalf("a call sharing the connection with the oversized answer failed: %v", err)
		}
		if n := dials.Load(); n != 1 {
			t.Errorf("the pool dialed %d times, want 1: the oversized answer cost the connection", n)
		}
		return pe
	}

	t.Run("response over the client limit", func(t *testing.T) {
		// The server allows what the client refuses: the client drops the
		// body and fails that call alone with a local 50.
		pe := oneOversized(t, bigReply(t, ServerConfig{}), 1<<10, protocol.StatusBadResponse, false)
		if !errors.Is(pe, protocol.ErrBodyTooLarge) {
			t.Errorf("err = %v, want it to wrap protocol.ErrBodyTooLarge", pe)
		}
	})

	t.Run("response over the server limit", func(t *testing.T) {
		// The server never sends an answer over its own limit: it
		// answers 50 instead.
		pe := oneOversized(t, bigReply(t, ServerConfig{MaxBody: 2 << 10}), 0, protocol.StatusBadResponse, true)
		if !strings.Contains(pe.Msg, "over the server's MaxBody") {
			t.Errorf("status 50 says %q, want it to say why", pe.Msg)
		}
	})
}

// blockingServer runs handlers that signal entered and block until release
// is closed or their ctx is done.
type blockingServer struct {
	*testServer
	entered chan string
	release chan struct{}
	ran     atomic.Int32
}

func startBlockingServer(t *testing.T, cfg ServerConfig) *blockingServer {
	bs := &blockingServer{entered: make(chan string, 1000), release: make(chan struct{})}
	bs.testServer = startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		bs.ran.Add(1)
		bs.entered <- string(req.Payload)
		select {
		case <-bs.release:
		case <-ctx.Done():
		}
		resp.Payload = append(resp.Payload[:0], req.Payload...)
	}), cfg)
	return bs
}

func TestTimeoutAfterSend(t *testing.T) {
	bs := startBlockingServer(t, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	req := newRequest("slow")
	req.Timeout = 50 * time.Millisecond
	start := time.Now()
	_, err := p.RoundTrip(testCtx(t), bs.addr, req)
	elapsed := time.Since(start)
	pe := wantStatus(t, err, protocol.StatusServerTimeout, false, false)
	if !errors.Is(err, protocol.ErrTimeout) {
		t.Errorf("errors.Is(err, protocol.ErrTimeout) = false for %v", pe)
	}
	if elapsed < 50*time.Millisecond {
		t.Errorf("returned after %v, before the 50ms budget", elapsed)
	}
	if n := p.pendingLen(bs.addr); n != 0 {
		t.Fatalf("pending table holds %d calls after the timeout, want 0", n)
	}
	if req.Timeout != 50*time.Millisecond {
		t.Errorf("RoundTrip changed req.Timeout to %v", req.Timeout)
	}

	// The handler was cancelled (the client's cancel event or its own
	// budget, whichever came first); if it answered anyway, the late
	// response is discarded. Either way the connection keeps working.
	// (TestClientSendsCancel forces a late response.)
	waitFor(t, bs.entered, "the handler")
	close(bs.release)
	ctx := testCtx(t)
	for i := range 20 {
		want := fmt.Sprintf("after-%d", i)
		resp, err := p.RoundTrip(ctx, bs.addr, newRequest(want))
		if err != nil {
			t.Fatalf("call after a late response: %v", err)
		}
		if got := string(resp.Payload); got != want {
			t.Fatalf("got %q, want %q (a late response leaked to another call?)", got, want)
		}
		p.Release(resp)
		<-bs.entered
	}
	if n := p.pendingLen(bs.addr); n != 0 {
		t.Errorf("pending table holds %d calls, want 0", n)
	}
}

func TestContextErrors(t *testing.T) {
	bs := startBlockingServer(t, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	defer close(bs.release)
	// Connect first, so the cases below measure the call, not the dial.
	warm, cancelWarm := context.WithCancel(testCtx(t))
	cancelWarm()
	_, _ = p.RoundTrip(warm, bs.addr, newRequest("warm"))

	t.Run("cancelled while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testCtx(t))
		go func() {
			<-bs.entered
			cancel()
		}()
		_, err := p.RoundTrip(ctx, bs.addr, newRequest("cancel me"))
		wantStatus(t, err, protocol.StatusClientError, false, false)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want it to wrap context.Canceled", err)
		}
		if n := p.pendingLen(bs.addr); n != 0 {
			t.Errorf("pending table holds %d calls after cancel", n)
		}
	})
	t.Run("cancelled before sending", func(t *testing.T) {
		ctx, cancel := context.WithCancel(testCtx(t))
		cancel()
		before := bs.ran.Load()
		_, err := p.RoundTrip(ctx, bs.addr, newRequest("never"))
		wantStatus(t, err, protocol.StatusClientError, false, true)
		if !errors.Is(err, context.Canceled) {
			t.Errorf("err = %v, want it to wrap context.Canceled", err)
		}
		if bs.ran.Load() != before {
			t.Errorf("the handler ran for a request that was never sent")
		}
	})
	t.Run("deadline before sending", func(t *testing.T) {
		ctx, cancel := context.WithDeadline(testCtx(t), time.Now().Add(-time.Second))
		defer cancel()
		_, err := p.RoundTrip(ctx, bs.addr, newRequest("never"))
		wantStatus(t, err, protocol.StatusClientTimeout, false, true)
	})
	t.Run("deadline after sending", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
		defer cancel()
		_, err := p.RoundTrip(ctx, bs.addr, newRequest("too slow"))
		wantStatus(t, err, protocol.StatusServerTimeout, false, false)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("err = %v, want it to wrap context.DeadlineExceeded", err)
		}
		<-bs.entered
	})
}

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

// countingDial counts dials and records their results.
type countingDial struct {
	n atomic.Int32
}

func (d *countingDial) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.n.Add(1)
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", addr)
}

func TestDialFailureAndBackoff(t *testing.T) {
	l := listen(t)
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	var d countingDial
	p := newPool(t, Config{Dial: d.dial})

	_, err := p.RoundTrip(testCtx(t), addr, newRequest("x"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	if !errors.Is(err, protocol.ErrUnavailable) {
		t.Errorf("errors.Is(err, protocol.ErrUnavailable) = false for %v", err)
	}
	if d.n.Load() != 1 {
		t.Fatalf("%d dials, want 1", d.n.Load())
	}
	// In backoff: fail fast without dialing.
	start := time.Now()
	_, err = p.RoundTrip(testCtx(t), addr, newRequest("x"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	if got := d.n.Load(); got != 1 {
		t.Fatalf("%d dials during backoff, want still 1", got)
	}
	if time.Since(start) > time.Second {
		t.Errorf("a call in backoff took %v; it should fail fast", time.Since(start))
	}

	// Once the backoff delay has passed, the next call dials again; the
	// delay doubles after each failure.
	deadline := time.Now().Add(defaultTestTimeout)
	for d.n.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // waiting out the backoff is what is tested
		_, _ = p.RoundTrip(testCtx(t), addr, newRequest("x"))
	}
	if time.Since(start) < backoffMin-10*time.Millisecond {
		t.Errorf("redialed after %v, before the %v backoff", time.Since(start), backoffMin)
	}
	if got := d.n.Load(); got != 2 {
		t.Fatalf("%d dials after the backoff, want 2", got)
	}

	// The address comes back: a successful dial resets the backoff.
	serveAgain(t, p, addr, 20*time.Millisecond) // waiting out the backoff
}

func TestSharedFirstDial(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	var d countingDial
	p := newPool(t, Config{ConnsPerAddr: 1, Dial: d.dial})
	const callers = 32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			<-start
			resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("first"))
			if err != nil {
				errs <- err
				return
			}
			p.Release(resp)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("RoundTrip: %v", err)
	}
	if got := d.n.Load(); got != 1 {
		t.Errorf("%d dials for %d concurrent first calls, want 1", got, callers)
	}
}

func TestPoolClose(t *testing.T) {
	bs := startBlockingServer(t, ServerConfig{})
	defer close(bs.release)
	p := NewPool(Config{Logger: quietLogger()})
	errc := make(chan error, 1)
	go func() {
		_, err := p.RoundTrip(context.Background(), bs.addr, newRequest("pending"))
		errc <- err
	}()
	waitFor(t, bs.entered, "the handler")
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	wantStatus(t, waitFor(t, errc, "the pending call"), protocol.StatusChannelInactive, false, false)

	_, err := p.RoundTrip(testCtx(t), bs.addr, newRequest("after close"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	_, err = p.RoundTrip(testCtx(t), "127.0.0.1:1", newRequest("new address after close"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	if !errors.Is(err, ErrClosed) {
		t.Errorf("err = %v, want it to wrap ErrClosed", err)
	}
	if err := p.Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// rawServer accepts connections and hands them to the test, reading
// nothing from them itself (a peer that stopped reading, until the test
// reads); those the test leaves are closed when it ends.
func rawServer(t *testing.T) (addr string, conns <-chan net.Conn) {
	t.Helper()
	l := listen(t)
	ch := make(chan net.Conn, 8)
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			ch <- c
		}
	})
	t.Cleanup(func() {
		_ = l.Close()
		wg.Wait()
		for {
			select {
			case c := <-ch:
				_ = c.Close()
			default:
				return
			}
		}
	})
	return l.Addr().String(), ch
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

func TestBadRequests(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	p := newPool(t, Config{})
	noRequestFlag := newRequest("x")
	noRequestFlag.Header.SetFlags(protocol.MakeFlags(protocol.FlagTwoWay, 22))
	event := newRequest("x")
	event.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay|protocol.FlagEvent, 22))
	tests := []struct {
		name string
		req  *protocol.Message
	}{
		{"nil", nil},
		{"no request flag", noRequestFlag},
		{"event flag", event},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := p.RoundTrip(testCtx(t), ts.addr, tc.req)
			wantStatus(t, err, protocol.StatusClientError, false, true)
		})
	}
}

func TestNilHandler(t *testing.T) {
	ts := startServer(t, nil, ServerConfig{})
	p := newPool(t, Config{})
	_, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
	wantStatus(t, err, protocol.StatusServiceNotFound, true, false)
}

func TestReadOnlyClearedByFreshDial(t *testing.T) {
	p := newPool(t, Config{ConnsPerAddr: 1})
	addr, l, c := readOnlyAddr(t, p)
	// The old server goes away and a new one takes the address.
	_ = c.Close()
	_ = l.Close()
	serveAgain(t, p, addr, 5*time.Millisecond) // until the old connection is seen closed
	if p.ReadOnly(addr) {
		t.Errorf("ReadOnly still true after a fresh connection")
	}
}

// serveAgain starts a server on addr, whose old one went away, and makes
// calls through p, pace apart, until one succeeds; they may fail only as
// not sent meanwhile.
func serveAgain(t *testing.T, p *Pool, addr string, pace time.Duration) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	startServerOn(t, l, echo, ServerConfig{})
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		resp, err := p.RoundTrip(testCtx(t), addr, newRequest("again"))
		if err == nil {
			p.Release(resp)
			return
		}
		if !errors.Is(err, ErrNotSent) || time.Now().After(deadline) {
			t.Fatalf("RoundTrip once %s is back: %v", addr, err)
		}
		time.Sleep(pace)
	}
}

// readOnlyAddr connects p to a fresh listener and has the server's end of
// the connection send the read-only event; it returns once p.ReadOnly
// reports it, with the listener and the server's end.
func readOnlyAddr(t *testing.T, p *Pool) (string, net.Listener, net.Conn) {
	t.Helper()
	l := listen(t)
	addr := l.Addr().String()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	// Connect, with a call whose ctx is cancelled as soon as it is sent.
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() {
		_, _ = p.RoundTrip(ctx, addr, newRequest("connect"))
	}()
	c := waitFor(t, accepted, "the connection")
	if c == nil {
		t.Fatal("accept failed")
	}
	cancel()
	if _, err := c.Write(protocol.AppendReadOnly(nil, 1)); err != nil {
		t.Fatalf("write read-only: %v", err)
	}
	deadline := time.Now().Add(defaultTestTimeout)
	for !p.ReadOnly(addr) {
		if time.Now().After(deadline) {
			t.Fatal("ReadOnly never became true")
		}
		time.Sleep(time.Millisecond) // no hook to await: poll the public API
	}
	return addr, l, c
}

// TestReadOnlyProbeFindsRestartedServer: an address nobody calls (a
// balancer leaves it out while it is read-only) comes back once a server
// restarted there: the pool probes it by itself, and OnBack says so.
// Probes of an address that keeps answering read-only are spaced, however
// often ReadOnly is asked.
func TestReadOnlyProbeFindsRestartedServer(t *testing.T) {
	back := make(chan string, 1)
	p := newPool(t, Config{ConnsPerAddr: 1, OnBack: func(a string) { back <- a }})
	addr, l, c := readOnlyAddr(t, p)
	_ = c.Close()

	// While the old server still accepts and answers every connection
	// with the read-only event, the address stays read-only and probes
	// back off: ~300 ms make a handful of dials (50, 100, 200 ms apart),
	// not hundreds.
	accepted := make(chan net.Conn, 1000)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- nc // closed below: the old server keeps them open
			_, _ = nc.Write(protocol.AppendReadOnly(nil, 1))
		}
	}()
	defer func() {
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	}()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		if !p.ReadOnly(addr) {
			t.Fatal("a probe answered with the read-only event cleared the mark")
		}
		time.Sleep(100 * time.Microsecond) // a balancer asking at its call rate
	}
	if n := len(accepted); n < 1 || n > 6 {
		t.Errorf("%d probe dials in 300 ms while the server answered read-only; want 1 to 6", n)
	}

	_ = l.Close()
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	startServerOn(t, l2, echo, ServerConfig{})
	if got := waitFor(t, back, "OnBack, with no call sent and ReadOnly not asked"); got != addr {
		t.Errorf("OnBack(%q), want %q", got, addr)
	}
	if p.ReadOnly(addr) {
		t.Error("ReadOnly still true after OnBack")
	}
	resp, err := p.RoundTrip(testCtx(t), addr, newRequest("again"))
	if err != nil {
		t.Fatalf("RoundTrip to the restarted address: %v", err)
	}
	p.Release(resp)
}

// Calls with different budgets on one connection each time out on their
// own budget, whatever order they were made in: the connection's one
// deadline sweeper is armed for the earliest, re-armed earlier when a
// shorter budget arrives, and re-armed for the next after each run. A call
// that answers in time is untouched.
func TestTimeoutsOfDifferentBudgets(t *testing.T) {
	bs := startBlockingServer(t, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	ctx := testCtx(t)
	budgets := []time.Duration{120 * time.Millisecond, 40 * time.Millisecond, 80 * time.Millisecond, 20 * time.Millisecond}
	type result struct {
		budget  time.Duration
		elapsed time.Duration
		err     error
	}
	results := make(chan result, len(budgets))
	for _, b := range budgets {
		req := newRequest(b.String())
		req.Timeout = b
		go func() {
			start := time.Now()
			_, err := p.RoundTrip(ctx, bs.addr, req)
			results <- result{b, time.Since(start), err}
		}()
		waitFor(t, bs.entered, "the handler of the "+b.String()+" call")
	}
	for range budgets {
		r := waitFor(t, results, "a timed-out call")
		wantStatus(t, r.err, protocol.StatusServerTimeout, false, false)
		if r.elapsed < r.budget {
			t.Errorf("the %v call timed out after %v, before its budget", r.budget, r.elapsed)
		}
		if r.elapsed > r.budget+time.Second {
			t.Errorf("the %v call timed out after %v, long after its budget", r.budget, r.elapsed)
		}
	}
	if n := p.pendingLen(bs.addr); n != 0 {
		t.Fatalf("pending table holds %d calls after the timeouts, want 0", n)
	}
	// A call with a budget that is answered in time is not timed out.
	close(bs.release)
	req := newRequest("in time")
	req.Timeout = 5 * time.Second
	resp, err := p.RoundTrip(ctx, bs.addr, req)
	if err != nil {
		t.Fatalf("call answered in time: %v", err)
	}
	p.Release(resp)
}

// TestCloseDuringProbe: a probe waiting for a heartbeat answer that never
// comes does not hold Pool.Close for the dial timeout.
func TestCloseDuringProbe(t *testing.T) {
	p := NewPool(Config{ConnsPerAddr: 1, DialTimeout: time.Minute, Logger: quietLogger()})
	addr, l, c := readOnlyAddr(t, p)
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- nc // a server that accepts and never answers
		}
	}()
	_ = c.Close() // the pool probes once it sees the old connection closed
	probe := waitFor(t, accepted, "the probe dial")
	if probe == nil {
		t.Fatal("accept failed")
	}
	defer probe.Close()
	if !p.ReadOnly(addr) {
		t.Error("ReadOnly = false while the probe waits for its answer")
	}
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v with a probe waiting for its heartbeat answer", d)
	}
	_ = l.Close()
	for nc := range accepted {
		nc.Close()
	}
}

// TestProbeRefusesAStrangeAnswer: a probe whose heartbeat is answered by
// something else than a heartbeat response (here a call's response, from
// a server speaking the protocol wrongly) does not clear the read-only
// mark.
func TestProbeRefusesAStrangeAnswer(t *testing.T) {
	p := newPool(t, Config{ConnsPerAddr: 1})
	addr, l, c := readOnlyAddr(t, p)
	_ = c.Close()
	accepted := make(chan net.Conn, 100)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- nc
			var resp protocol.Message
			resp.Header.Init(protocol.MakeFlags(0, 22), protocol.StatusOK, 1)
			_, _ = nc.Write(protocol.AppendMessage(nil, &resp))
		}
	}()
	// Watch until a probe was answered and, with backoff, a second began.
	deadline := time.Now().Add(defaultTestTimeout)
	for len(accepted) < 2 {
		if !p.ReadOnly(addr) {
			t.Fatal("a probe answered with a call's response cleared the read-only mark")
		}
		if time.Now().After(deadline) {
			t.Fatal("no second probe came")
		}
		time.Sleep(time.Millisecond) // a balancer asking at its call rate
	}
	if !p.ReadOnly(addr) {
		t.Fatal("a probe answered with a call's response cleared the read-only mark")
	}
	_ = l.Close()
	for nc := range accepted {
		nc.Close()
	}
}

// TestForget: a forgotten address's connection with a call in flight
// closes after that call is answered (the call succeeds), an idle one at
// once, and a later call to the address dials afresh.
func TestForget(t *testing.T) {
	bs := startBlockingServer(t, ServerConfig{})
	var d countingDial
	p := newPool(t, Config{ConnsPerAddr: 1, Dial: d.dial})
	done := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(testCtx(t), bs.addr, newRequest("in flight"))
		if err == nil {
			p.Release(resp)
		}
		done <- err
	}()
	waitFor(t, bs.entered, "the call in flight")
	p.Forget(bs.addr)
	if len(*p.eps.Load()) != 0 {
		t.Fatal("the address is still known after Forget")
	}
	close(bs.release)
	if err := waitFor(t, done, "the call in flight"); err != nil {
		t.Fatalf("a call in flight when its address was forgotten failed: %v", err)
	}
	waitNoConns(t, p, "the connection to close after its last call")

	resp, err := p.RoundTrip(testCtx(t), bs.addr, newRequest("again"))
	if err != nil {
		t.Fatalf("a call to the address after Forget: %v", err)
	}
	p.Release(resp)
	if n := d.n.Load(); n != 2 {
		t.Errorf("%d dials, want 2 (one before Forget, one after)", n)
	}
	p.Forget(bs.addr)
	waitNoConns(t, p, "an idle connection to close when forgotten")
}

// waitNoConns waits until p holds no connection (they close in the
// background: no event says so).
func waitNoConns(t *testing.T, p *Pool, what string) {
	t.Helper()
	wait.Until(t, defaultTestTimeout, time.Millisecond, what, func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return len(p.conns) == 0
	})
}

// TestLargeRequestsUseTheirOwnConnection: a request at or over
// LargeMessage goes over a connection of its own, so it never queues in
// front of small calls; with LargeMessage negative it shares theirs.
func TestLargeRequestsUseTheirOwnConnection(t *testing.T) {
	for _, tt := range []struct {
		name  string
		large int
		want  int64 // connections accepted in the end
	}{
		{"own connection", 1 << 10, 3},
		{"shared", -1, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := &acceptCounter{Listener: listen(t)}
			ts := startServerOn(t, l, echo, ServerConfig{})
			p := newPool(t, Config{ConnsPerAddr: 2, LargeMessage: tt.large})
			ctx := testCtx(t)
			for range 4 { // both shared connections get dialed
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest("small"))
				if err != nil {
					t.Fatal(err)
				}
				p.Release(resp)
			}
			big := strings.Repeat("x", 2<<10)
			large := func() {
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest(big))
				if err != nil {
					t.Fatal(err)
				}
				if string(resp.Payload) != big {
					t.Fatalf("large echo came back with %d bytes", len(resp.Payload))
				}
				p.Release(resp)
			}
			// One dial per address is in flight at a time, and a call
			// uses another live connection meanwhile: keep calling until
			// the dials are done, bounded by the test's timeout.
			for range 3 {
				large()
			}
			for l.accepted.Load() < tt.want && ctx.Err() == nil {
				large()
				time.Sleep(time.Millisecond)
			}
			for range 20 { // more of both: no further connection
				large()
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest("small"))
				if err != nil {
					t.Fatal(err)
				}
				p.Release(resp)
			}
			if got := l.accepted.Load(); got != tt.want {
				t.Fatalf("server accepted %d connections, want %d", got, tt.want)
			}
		})
	}
}
