package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// defaultTestTimeout bounds every wait in these tests.
const defaultTestTimeout = 10 * time.Second

func testCtx(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), defaultTestTimeout)
	t.Cleanup(cancel)
	return ctx
}

// lockedBuffer is a log sink safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// quietLogger drops everything below Error, so expected connection noise
// does not clutter test output.
func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(discard{}, &slog.HandlerOptions{Level: slog.LevelError}))
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

// echo answers with the request's payload, attachments and idempotency
// key.
var echo = HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
	resp.Payload = append(resp.Payload[:0], req.Payload...)
	resp.IdempotencyKey = req.IdempotencyKey
	if len(req.Attachments) > 0 {
		resp.Attachments = make(map[string]string, len(req.Attachments))
		for k, v := range req.Attachments {
			resp.Attachments[k] = v
		}
	}
})

type testServer struct {
	srv    *Server
	addr   string
	served chan error // Serve's result
}

// startServerOn serves h on l; the server is closed at the end of the test.
func startServerOn(t testing.TB, l net.Listener, h Handler, cfg ServerConfig) *testServer {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	ts := &testServer{srv: NewServer(h, cfg), addr: l.Addr().String(), served: make(chan error, 1)}
	go func() { ts.served <- ts.srv.Serve(l) }()
	t.Cleanup(func() {
		_ = ts.srv.Close()
		select {
		case err := <-ts.served:
			if !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		case <-time.After(defaultTestTimeout):
			t.Errorf("Serve did not return after Close")
		}
	})
	return ts
}

func listen(t testing.TB) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	return l
}

func startServer(t testing.TB, h Handler, cfg ServerConfig) *testServer {
	t.Helper()
	return startServerOn(t, listen(t), h, cfg)
}

func newPool(t testing.TB, cfg Config) *Pool {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = quietLogger()
	}
	p := NewPool(cfg)
	t.Cleanup(func() { _ = p.Close() })
	return p
}

// newRequest returns a two-way request with the given payload.
func newRequest(payload string) *protocol.Message {
	req := &protocol.Message{Service: "test.Echo", Method: "Echo", Payload: []byte(payload)}
	req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22))
	return req
}

// wantStatus checks that err is a *protocol.Error with the given status,
// origin and ErrNotSent-ness.
func wantStatus(t testing.TB, err error, status protocol.Status, remote, notSent bool) *protocol.Error {
	t.Helper()
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v (%T), want a *protocol.Error with status %d", err, err, status)
	}
	if pe.Status != status {
		t.Fatalf("status = %d, want %d (err: %v)", pe.Status, status, err)
	}
	if pe.Remote != remote {
		t.Fatalf("Remote = %v, want %v (err: %v)", pe.Remote, remote, err)
	}
	if got := errors.Is(err, ErrNotSent); got != notSent {
		t.Fatalf("errors.Is(err, ErrNotSent) = %v, want %v (err: %v)", got, notSent, err)
	}
	return pe
}

// waitFor fails the test if ch does not deliver within the test timeout.
func waitFor[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(defaultTestTimeout):
		t.Fatalf("timed out waiting for %s", what)
		var zero T
		return zero
	}
}

// acceptCounter counts accepted connections.
type acceptCounter struct {
	net.Listener
	accepted atomic.Int64
}

func (l *acceptCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
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

// countingDial counts dials and records their results.
type countingDial struct {
	n atomic.Int32
}

func (d *countingDial) dial(ctx context.Context, addr string) (net.Conn, error) {
	d.n.Add(1)
	var nd net.Dialer
	return nd.DialContext(ctx, "tcp", addr)
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

// tcpPair returns both ends of a loopback TCP connection with socket
// buffers much smaller than the frames written, so a large frame keeps its
// write in progress until the peer reads it.
func tcpPair(t *testing.T) (w, r *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, acc, "the accepted connection")
	if s == nil {
		t.Fatal("accept failed")
	}
	w, r = c.(*net.TCPConn), s.(*net.TCPConn)
	_ = w.SetWriteBuffer(linkBuffer)
	_ = r.SetReadBuffer(linkBuffer)
	t.Cleanup(func() { w.Close(); r.Close() })
	return w, r
}

// readRequests reads frames from c until it has seen n requests, skipping
// events, and checks that each request's payload is want: a frame whose
// write was cut off by its caller's time must still arrive whole.
func readRequests(t *testing.T, c net.Conn, n int, want []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	r := protocol.NewReader(bufio.NewReader(c), 64<<20)
	for got := 0; got < n; {
		var m protocol.Message
		if err := r.Read(&m); err != nil {
			t.Fatalf("after %d of %d requests: %v", got, n, err)
		}
		if m.Header.Flags().IsEvent() {
			continue
		}
		if !bytes.Equal(m.Payload, want) {
			t.Fatalf("request %d arrived with a payload of %d bytes, want %d intact ones", got, len(m.Payload), len(want))
		}
		got++
	}
}

// withMaxQueued sets maxQueued for one test.
func withMaxQueued(t *testing.T, n int) {
	old := maxQueued
	maxQueued = n
	t.Cleanup(func() { maxQueued = old })
}

// eventually polls cond until it holds, failing the test after the test
// timeout. For state that has no event to wait on.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, defaultTestTimeout, time.Millisecond, what, cond)
}

// readFrames reads every frame from c onto the returned channel, which is
// closed when c fails or is closed.
func readFrames(c net.Conn) <-chan *protocol.Message {
	ch := make(chan *protocol.Message, 100)
	go func() {
		defer close(ch)
		rd := protocol.NewReader(bufio.NewReader(c), 0)
		for {
			m := new(protocol.Message)
			if err := rd.Read(m); err != nil {
				return
			}
			ch <- m
		}
	}()
	return ch
}

// nextFrameOrEOF returns the next frame, or nil when the connection ended.
func nextFrameOrEOF(t *testing.T, frames <-chan *protocol.Message, what string) *protocol.Message {
	t.Helper()
	select {
	case m, ok := <-frames:
		if !ok {
			return nil
		}
		return m
	case <-time.After(defaultTestTimeout):
		t.Fatalf("timed out waiting for %s", what)
		return nil
	}
}

func nextFrame(t *testing.T, frames <-chan *protocol.Message, what string) *protocol.Message {
	t.Helper()
	m := nextFrameOrEOF(t, frames, what)
	if m == nil {
		t.Fatalf("connection closed while waiting for %s", what)
	}
	return m
}

func writeResponse(t *testing.T, c net.Conn, id uint64, payload string) {
	t.Helper()
	var resp protocol.Message
	resp.Header.Init(protocol.MakeFlags(0, 22), protocol.StatusOK, id)
	resp.Payload = []byte(payload)
	if _, err := c.Write(protocol.AppendMessage(nil, &resp)); err != nil {
		t.Fatalf("write response %d: %v", id, err)
	}
}
