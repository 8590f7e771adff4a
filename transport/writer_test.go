package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/protocol"
)

// gateConn records writes; the first Write blocks until gate is closed.
type gateConn struct {
	net.Conn
	gate    chan struct{}
	entered chan struct{}
	mu      sync.Mutex
	writes  [][]byte
	fail    error
}

func (c *gateConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	first := len(c.writes) == 0
	c.writes = append(c.writes, bytes.Clone(p))
	fail := c.fail
	c.mu.Unlock()
	if first {
		close(c.entered)
		<-c.gate
	}
	if fail != nil {
		return 0, fail
	}
	return len(p), nil
}

func frameOf(payload string) *protocol.Message {
	m := newRequest(payload)
	m.Header.SetID(uint64(len(payload)))
	return m
}

// startFlush makes a goroutine write frameOf(payload) through w over c,
// becoming the flusher, and waits until its write is blocked in c; the
// returned channel gets writeMessage's error once c's gate opens.
func startFlush(t *testing.T, c *gateConn, w *frameWriter, payload string) <-chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() {
		_, err := w.writeMessage(frameOf(payload), limit{})
		done <- err
	}()
	waitFor(t, c.entered, "the first write")
	return done
}

func TestWriterCoalesces(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	var w frameWriter
	w.init(c, func(err error) { t.Errorf("unexpected write error: %v", err) })
	done := startFlush(t, c, &w, "first")
	// A flusher is active: these return at once, their frames queued.
	for _, p := range []string{"a", "bb", "ccc"} {
		if queued, err := w.writeMessage(frameOf(p), limit{}); !queued || err != nil {
			t.Fatalf("writeMessage while flushing = %v, %v", queued, err)
		}
	}
	if err := w.writeEvent(eventHeartbeat, 9); err != nil {
		t.Fatalf("writeEvent: %v", err)
	}
	close(c.gate)
	if err := waitFor(t, done, "the flusher"); err != nil {
		t.Fatalf("flusher: %v", err)
	}
	if !w.idle() {
		t.Errorf("writer not idle after the flush")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.writes) != 2 {
		t.Fatalf("%d writes, want 2 (the first frame, then the rest coalesced)", len(c.writes))
	}
	rd := protocol.NewReader(bufio.NewReader(bytes.NewReader(c.writes[1])), 0)
	var got []string
	for {
		var m protocol.Message
		if err := rd.Read(&m); err != nil {
			break
		}
		if m.IsHeartbeat() {
			got = append(got, "heartbeat")
			continue
		}
		got = append(got, string(m.Payload))
	}
	want := []string{"a", "bb", "ccc", "heartbeat"}
	if len(got) != len(want) {
		t.Fatalf("second write held %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("second write held %v, want %v", got, want)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	boom := errors.New("boom")
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{}), fail: boom}
	close(c.gate)
	var failed []error
	var w frameWriter
	w.init(c, func(err error) { failed = append(failed, err) })

	queued, err := w.writeMessage(frameOf("x"), limit{})
	if !queued || !errors.Is(err, boom) {
		t.Fatalf("failing write = %v, %v; want queued with the write error", queued, err)
	}
	if len(failed) != 1 {
		t.Fatalf("onError called %d times, want 1", len(failed))
	}
	// Sticky: later frames are refused before they are queued.
	queued, err = w.writeMessage(frameOf("y"), limit{})
	if queued || !errors.Is(err, boom) {
		t.Fatalf("write after failure = %v, %v; want not queued", queued, err)
	}
	if err := w.writeEvent(eventReadOnly, 1); !errors.Is(err, boom) {
		t.Fatalf("writeEvent after failure = %v", err)
	}

	var w2 frameWriter
	w2.init(c, func(error) {})
	w2.fail(ErrClosed)
	if queued, err := w2.writeMessage(frameOf("z"), limit{}); queued || !errors.Is(err, ErrClosed) {
		t.Fatalf("write after fail(ErrClosed) = %v, %v", queued, err)
	}
}

// A flusher yields before writing only while frames have recently joined
// other flushes: a frame joining sets company, and solo flushes wear it
// down to zero, after which frames are written at once.
func TestWriterCompany(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	var w frameWriter
	w.init(c, func(err error) { t.Errorf("unexpected write error: %v", err) })
	company := func() int {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.company
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.writeMessage(frameOf("first"), limit{})
		done <- err
	}()
	waitFor(t, c.entered, "the first write")
	if got := company(); got != 0 {
		t.Fatalf("company = %d before anyone joined, want 0", got)
	}
	if _, err := w.writeMessage(frameOf("joins"), limit{}); err != nil {
		t.Fatal(err)
	}
	if got := company(); got != companyTurns {
		t.Fatalf("company = %d after a frame joined a flush, want %d", got, companyTurns)
	}
	close(c.gate)
	if err := waitFor(t, done, "the flusher"); err != nil {
		t.Fatal(err)
	}
	for i := range companyTurns + 3 {
		if _, err := w.writeMessage(frameOf("solo"), limit{}); err != nil {
			t.Fatal(err)
		}
		want := max(0, companyTurns-1-i)
		if got := company(); got != want {
			t.Fatalf("company = %d after %d solo flushes, want %d", got, i+1, want)
		}
	}
}

// TestWriterGrowsThroughPool: frames that pile up behind a blocked write
// past bufpool.Min and bufpool.MaxKept grow the buffer through the pool,
// leave in one write, whole and in order, and the oversized buffer is not
// kept afterwards.
func TestWriterGrowsThroughPool(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	var w frameWriter
	w.init(c, func(err error) { t.Errorf("unexpected write error: %v", err) })
	done := startFlush(t, c, &w, "first")
	const frames = 600 // ~600 KiB queued: grows past bufpool.MaxKept
	payload := func(i int) string { return fmt.Sprintf("%04d%s", i, strings.Repeat("p", 1000)) }
	for i := range frames {
		if queued, err := w.writeMessage(frameOf(payload(i)), limit{}); !queued || err != nil {
			t.Fatalf("writeMessage %d while flushing = %v, %v", i, queued, err)
		}
	}
	w.mu.Lock()
	queuedCap := cap(w.buf)
	w.mu.Unlock()
	if queuedCap <= bufpool.MaxKept {
		t.Fatalf("buffer capacity %d with %d frames queued; the test needs more than %d", queuedCap, frames, bufpool.MaxKept)
	}
	close(c.gate)
	if err := waitFor(t, done, "the flusher"); err != nil {
		t.Fatalf("flusher: %v", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.writes) != 2 {
		t.Fatalf("%d writes, want 2 (the first frame, then the rest coalesced)", len(c.writes))
	}
	rd := protocol.NewReader(bufio.NewReader(bytes.NewReader(c.writes[1])), 0)
	for i := range frames {
		var m protocol.Message
		if err := rd.Read(&m); err != nil {
			t.Fatalf("frame %d of the second write: %v", i, err)
		}
		if got, want := string(m.Payload), payload(i); got != want {
			t.Fatalf("frame %d holds %.8q..., want %.8q...", i, got, want)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if cap(w.spare) > bufpool.MaxKept || cap(w.buf) > bufpool.MaxKept {
		t.Errorf("writer keeps buffers of %d and %d bytes after the flush, want at most %d", cap(w.buf), cap(w.spare), bufpool.MaxKept)
	}
}

// xorConn stands for any net.Conn wrapper that changes or accounts for
// the bytes it writes (encryption, obfuscation, byte metrics, rate
// limiting, fault injection) and embeds *net.TCPConn, as such wrappers
// often do to keep SetNoDelay, SetKeepAlive, File and SyscallConn.
type xorConn struct{ *net.TCPConn }

func (c xorConn) Write(p []byte) (int, error) {
	q := make([]byte, len(p))
	for i, b := range p {
		q[i] = b ^ 0x5a
	}
	return c.TCPConn.Write(q)
}

func (c xorConn) Read(p []byte) (int, error) {
	n, err := c.TCPConn.Read(p)
	for i := range p[:n] {
		p[i] ^= 0x5a
	}
	return n, err
}

type xorListener struct{ net.Listener }

func (l xorListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return xorConn{c.(*net.TCPConn)}, nil
}

// TestWrappedConnWritesThroughItsWrite: a connection wrapper that embeds
// *net.TCPConn (promoting SyscallConn) but has a Write of its own is
// written through that Write: the writer makes the system calls itself
// only on the net package's own sockets.
func TestWrappedConnWritesThroughItsWrite(t *testing.T) {
	ts := startServerOn(t, xorListener{listen(t)}, echo, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1, Dial: func(ctx context.Context, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return nil, err
		}
		return xorConn{c.(*net.TCPConn)}, nil
	}})
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("through the wrapper"))
	if err != nil {
		t.Fatalf("a call over a wrapped connection failed: %v (the writer bypassed the wrapper's Write)", err)
	}
	if string(resp.Payload) != "through the wrapper" {
		t.Errorf("payload = %q", resp.Payload)
	}
	p.Release(resp)
}

// A corked writer holds small frames until uncork, or until corkMax
// bytes wait, and then writes them together.
func TestWriterCork(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	close(c.gate)
	var w frameWriter
	w.init(c, func(err error) { t.Errorf("unexpected write error: %v", err) })
	writes := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.writes)
	}
	w.cork()
	for _, p := range []string{"a", "bb", "ccc"} {
		if queued, err := w.writeMessage(frameOf(p), limit{}); !queued || err != nil {
			t.Fatalf("writeMessage while corked = %v, %v", queued, err)
		}
	}
	if n := writes(); n != 0 {
		t.Fatalf("%d writes while corked, want 0", n)
	}
	if err := w.uncork(); err != nil {
		t.Fatalf("uncork: %v", err)
	}
	if n := writes(); n != 1 {
		t.Fatalf("%d writes after uncork, want 1 with the three frames", n)
	}
	if err := w.uncork(); err != nil || writes() != 1 {
		t.Fatalf("a second uncork: %v, %d writes; want nothing written", err, writes())
	}

	w.cork()
	big := strings.Repeat("x", 1<<10)
	for range corkMax / len(big) {
		if _, err := w.writeMessage(frameOf(big), limit{}); err != nil {
			t.Fatalf("writeMessage: %v", err)
		}
	}
	if n := writes(); n != 2 {
		t.Fatalf("%d writes once %d bytes waited in a corked writer, want 2 (one at corkMax)", n, corkMax)
	}
	if err := w.uncork(); err != nil {
		t.Fatalf("uncork: %v", err)
	}
	if !w.idle() {
		t.Errorf("writer not idle after uncork")
	}
}
