package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
)

// A frame with a large payload is written from the caller's buffer: its
// bytes on the wire are AppendMessage's, frames queued meanwhile stay
// whole, and writeMessage returns only once the payload has been written.
func TestWriterLargeFrame(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	var w frameWriter
	w.init(c, func(err error) { t.Errorf("unexpected write error: %v", err) })
	first := startFlush(t, c, &w, "first")

	large := frameOf(string(bytes.Repeat([]byte("L"), largePayload+123)))
	type result struct {
		queued  bool
		err     error
		written bool // the payload was on the wire when writeMessage returned
	}
	done := make(chan result, 1)
	go func() {
		queued, err := w.writeMessage(large, limit{})
		c.mu.Lock()
		var all []byte
		for _, b := range c.writes {
			all = append(all, b...)
		}
		c.mu.Unlock()
		done <- result{queued, err, bytes.Contains(all, large.Payload)}
	}()
	if queued, err := w.writeMessage(frameOf("small"), limit{}); !queued || err != nil {
		t.Fatalf("small writeMessage while flushing = %v, %v", queued, err)
	}
	close(c.gate)
	if err := waitFor(t, first, "the flusher"); err != nil {
		t.Fatalf("flusher: %v", err)
	}
	r := waitFor(t, done, "the large write")
	if !r.queued || r.err != nil {
		t.Fatalf("large writeMessage = %v, %v; want queued, nil", r.queued, r.err)
	}
	if !r.written {
		t.Fatalf("writeMessage of a large frame returned before its payload was written")
	}
	if !w.idle() {
		t.Errorf("writer not idle after the writes")
	}

	c.mu.Lock()
	var stream []byte
	for _, b := range c.writes {
		stream = append(stream, b...)
	}
	c.mu.Unlock()
	if want := protocol.AppendMessage(nil, large); !bytes.Contains(stream, want) {
		t.Errorf("the large frame on the wire differs from AppendMessage's encoding")
	}
	rd := protocol.NewReader(bufio.NewReader(bytes.NewReader(stream)), 0)
	got := map[string]bool{}
	for {
		var m protocol.Message
		if err := rd.Read(&m); err != nil {
			break
		}
		got[string(m.Payload)] = true
	}
	for _, p := range []string{"first", "small", string(large.Payload)} {
		if !got[p] {
			t.Errorf("frame with a %d-byte payload missing from the stream (%d frames decoded)", len(p), len(got))
		}
	}
}

// A large writer waiting for its turn is released, with the error, when
// the flusher's write fails.
func TestWriterLargeWaiterReleasedOnFailure(t *testing.T) {
	boom := errors.New("boom")
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{}), fail: boom}
	var w frameWriter
	w.init(c, func(error) {})
	first := startFlush(t, c, &w, "first")
	type result struct {
		queued bool
		err    error
	}
	done := make(chan result, 1)
	go func() {
		queued, err := w.writeMessage(frameOf(string(make([]byte, largePayload))), limit{})
		done <- result{queued, err}
	}()
	close(c.gate)
	if err := waitFor(t, first, "the flusher"); !errors.Is(err, boom) {
		t.Fatalf("flusher err = %v, want boom", err)
	}
	r := waitFor(t, done, "the waiting large write")
	if r.queued || !errors.Is(r.err, boom) {
		t.Fatalf("large write after the failure = %v, %v; want not queued, boom", r.queued, r.err)
	}
}

// errSignal is a context that reports its first Err call: writeLarge
// calls it, with mu held, right before it waits for its turn.
type errSignal struct {
	context.Context
	once   sync.Once
	called chan struct{}
}

func (c *errSignal) Err() error {
	c.once.Do(func() { close(c.called) })
	return c.Context.Err()
}

// TestLargeWriteAfterItsLimitEnded: a large frame whose caller gives up as
// its turn to write comes is not sent (not queued, ctx's error), and
// nothing of it reaches the peer.
func TestLargeWriteAfterItsLimitEnded(t *testing.T) {
	wc, rc := tcpPair(t)
	var w frameWriter
	w.init(wc, func(error) {})

	// Another goroutine's flush is in progress (a finish goroutine).
	w.mu.Lock()
	w.flushing = true
	w.mu.Unlock()

	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	ctx := &errSignal{Context: base, called: make(chan struct{})}
	type result struct {
		queued bool
		err    error
	}
	res := make(chan result, 1)
	go func() {
		q, err := w.writeMessage(frameOf(strings.Repeat("L", 1<<20)), limit{ctx: ctx})
		res <- result{q, err}
	}()
	waitFor(t, ctx.called, "the large writer to check its limit")
	// It checked with mu held and released mu only in turn.Wait: it is
	// waiting for its turn now. The flush ends as the caller gives up.
	w.mu.Lock()
	cancel()
	w.endFlushLocked()
	w.mu.Unlock()

	r := waitFor(t, res, "the large writer")
	if r.queued || !errors.Is(r.err, context.Canceled) {
		t.Errorf("writeMessage = (queued %v, %v), want (false, context.Canceled): the caller gave up before any byte of its frame was written", r.queued, r.err)
	}
	// Whatever was handed on must not include the abandoned frame: the
	// next frame the peer reads is this small one.
	if _, err := w.writeMessage(frameOf("next"), limit{}); err != nil {
		t.Fatalf("small frame: %v", err)
	}
	rd := protocol.NewReader(bufio.NewReader(rc), 64<<20)
	var m protocol.Message
	if err := rd.Read(&m); err != nil {
		t.Fatalf("read: %v", err)
	}
	if string(m.Payload) != "next" {
		t.Errorf("the peer got a frame of %d bytes first: the request its caller gave up on was sent anyway", len(m.Payload))
	}
}

// TestLargeBuffersGoBack: every large buffer of a large echo goes back to
// the shared pool, on both sides: the request's body the server read, the
// response its handler encoded into a pooled buffer (as the codecs do),
// and the response's body the client read, once released. A buffer left
// out shows as bufpool.Outstanding staying up.
func TestLargeBuffersGoBack(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		resp.Payload = append(bufpool.Get(len(req.Payload))[:0], req.Payload...)
	}), ServerConfig{})
	p := newPool(t, Config{})
	ctx := testCtx(t)
	payload := bytes.Repeat([]byte("x"), 1<<20)
	start := bufpool.Outstanding()
	for i := range 10 {
		resp, err := p.RoundTrip(ctx, ts.addr, newRequest(string(payload)))
		if err != nil {
			t.Fatalf("large call %d: %v", i, err)
		}
		if !bytes.Equal(resp.Payload, payload) {
			t.Fatalf("large call %d: %d bytes back, not the %d sent", i, len(resp.Payload), len(payload))
		}
		p.Release(resp)
	}
	// The server hands its buffers back after writing the response, which
	// may be after the client has it.
	wait.Until(t, defaultTestTimeout, time.Millisecond, "the large buffers to go back to the pool", func() bool {
		return bufpool.Outstanding() <= start
	})
}
