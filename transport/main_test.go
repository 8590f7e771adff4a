package transport

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/protocol"
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
