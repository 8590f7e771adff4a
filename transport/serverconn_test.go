// Tests of one server connection: read, dispatch, answer, heartbeat.

package transport

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func bufioReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// dialRaw opens a plain TCP connection to addr, closed at the end of the
// test.
func dialRaw(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// readFull reads n bytes with a bounded wait.
func readFull(t *testing.T, c net.Conn, n int) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	b := make([]byte, n)
	if _, err := io.ReadFull(c, b); err != nil {
		t.Fatalf("read %d bytes: %v", n, err)
	}
	return b
}

// frame encodes a request header with the given raw body.
func rawFrame(id uint64, flags protocol.Flags, body []byte) []byte {
	var h protocol.Header
	h.Init(flags, 0, id)
	h.SetBodyLen(uint32(len(body)))
	return append(h[:], body...)
}

func readResponse(t *testing.T, rd *protocol.Reader, c net.Conn) *protocol.Message {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	var m protocol.Message
	if err := rd.Read(&m); err != nil {
		t.Fatalf("read response: %v", err)
	}
	return &m
}

func TestHeartbeatRaw(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	c := dialRaw(t, ts.addr)
	if _, err := c.Write(mustHex(t, "dabb e200 0102030405060708 00000001 4e")); err != nil {
		t.Fatalf("write: %v", err)
	}
	want := mustHex(t, "dabb 2214 0102030405060708 00000001 4e")
	if got := readFull(t, c, len(want)); !bytes.Equal(got, want) {
		t.Errorf("heartbeat response\n got % x\nwant % x", got, want)
	}
}

func TestServerClosesSilentClient(t *testing.T) {
	const interval = 30 * time.Millisecond
	ts := startServer(t, echo, ServerConfig{HeartbeatInterval: interval})
	c := dialRaw(t, ts.addr)
	_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	start := time.Now()
	got, err := io.ReadAll(c) // never answers the server's heartbeats
	if err != nil {
		t.Fatalf("read until the server closes: %v", err)
	}
	if d := time.Since(start); d < 2*interval {
		t.Errorf("closed after %v, before 3 silent intervals of %v", d, interval)
	}
	if !bytes.HasPrefix(got, []byte{0xda, 0xbb, 0xe2, 0x00}) {
		t.Errorf("the server sent % x before closing, want heartbeats", got)
	}
}

// TestSlowLargeRequestIsNotSilence: a client sending one large request
// slowly, over more than three heartbeat intervals, is making progress:
// the server reads it whole and answers instead of closing the connection
// as silent.
func TestSlowLargeRequestIsNotSilence(t *testing.T) {
	const interval = 100 * time.Millisecond
	ts := startServer(t, echo, ServerConfig{HeartbeatInterval: interval})
	c := dialRaw(t, ts.addr)
	frames := readFrames(c)
	req := newRequest(strings.Repeat("z", 64<<10))
	req.Header.SetID(7)
	frame := protocol.AppendMessage(nil, req)
	const pieces = 10 // one every interval/2: 5 intervals in all, silence is 3
	step := (len(frame) + pieces - 1) / pieces
	for b := frame; len(b) > 0; b = b[min(step, len(b)):] {
		if _, err := c.Write(b[:min(step, len(b))]); err != nil {
			t.Fatalf("write: %v (the server closed the connection)", err)
		}
		time.Sleep(interval / 2) // the slow sender under test, not a synchronisation
	}
	for {
		m := nextFrameOrEOF(t, frames, "the response")
		if m == nil {
			t.Fatal("the server closed the connection instead of answering")
		}
		if m.IsHeartbeat() {
			continue // the server's own heartbeats while it waited
		}
		if m.Header.ID() != 7 || len(m.Payload) != 64<<10 {
			t.Fatalf("got id %d with %d bytes, want the echo of request 7", m.Header.ID(), len(m.Payload))
		}
		return
	}
}

func TestBadFramesCloseConnection(t *testing.T) {
	const limit = 1 << 20
	ts := startServer(t, echo, ServerConfig{MaxBody: limit})
	p := newPool(t, Config{})
	tests := []struct {
		name  string
		bytes []byte
	}{
		{"garbage", []byte("GET / HTTP/1.1\r\nHost: example\r\n\r\n")},
		{"wrong magic", mustHex(t, "cafe c016 0000000000000001 00000000")},
		{"length over what the server drops", mustHex(t, "dabb c016 0000000000000001 04000001")},
		{"claimed 4 GiB", mustHex(t, "dabb c016 0000000000000001 ffffffff")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			c := dialRaw(t, ts.addr)
			if _, err := c.Write(tc.bytes); err != nil {
				t.Fatalf("write: %v", err)
			}
			_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
			rest, err := io.ReadAll(c)
			if err != nil {
				t.Fatalf("want the server to close the connection, read: %v", err)
			}
			if len(rest) != 0 {
				t.Errorf("server answered % x before closing", rest)
			}
			runtime.ReadMemStats(&after)
			if grew := after.TotalAlloc - before.TotalAlloc; grew > 64<<20 {
				t.Errorf("the server allocated %d bytes for a bad frame", grew)
			}
			// A well-behaved connection is still served.
			resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("still here"))
			if err != nil {
				t.Fatalf("RoundTrip on another connection: %v", err)
			}
			if string(resp.Payload) != "still here" {
				t.Errorf("payload = %q", resp.Payload)
			}
			p.Release(resp)
		})
	}
}

func TestMalformedBody(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	c := dialRaw(t, ts.addr)
	rd := protocol.NewReader(bufio.NewReader(c), 0)
	twoWay := protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22)
	bodies := []struct {
		name string
		body []byte
	}{
		{"truncated service", []byte{0x7f, 'a', 'b'}},
		{"empty body", nil},
		{"bad timeout", append([]byte{0, 0, 1, 7}, "timeout\x02xx"...)},
	}
	for i, tc := range bodies {
		t.Run(tc.name, func(t *testing.T) {
			id := uint64(100 + i)
			if _, err := c.Write(rawFrame(id, twoWay, tc.body)); err != nil {
				t.Fatalf("write: %v", err)
			}
			m := readResponse(t, rd, c)
			if m.Header.ID() != id || m.Header.Status() != protocol.StatusBadRequest {
				t.Fatalf("got id %d status %d, want id %d status 40", m.Header.ID(), m.Header.Status(), id)
			}
			// The connection keeps working.
			ok := newRequest("ok")
			ok.Header.SetID(id + 1000)
			if _, err := c.Write(protocol.AppendMessage(nil, ok)); err != nil {
				t.Fatalf("write: %v", err)
			}
			m = readResponse(t, rd, c)
			if m.Header.ID() != id+1000 || m.Header.Status() != protocol.StatusOK || string(m.Payload) != "ok" {
				t.Fatalf("after a malformed frame got id %d status %d payload %q", m.Header.ID(), m.Header.Status(), m.Payload)
			}
		})
	}
}

// TestMaxConcurrent: a request over the limit is answered with 100 at
// once, and a call gives its slot back before its answer.
func TestMaxConcurrent(t *testing.T) {
	t.Run("over the limit answered at once", func(t *testing.T) {
		const limit = 4
		bs := startBlockingServer(t, ServerConfig{MaxConcurrent: limit})
		p := newPool(t, Config{})
		results := make(chan error, limit)
		for i := range limit {
			go func() {
				resp, err := p.RoundTrip(context.Background(), bs.addr, newRequest(fmt.Sprint(i)))
				if err == nil {
					p.Release(resp)
				}
				results <- err
			}()
		}
		for range limit {
			waitFor(t, bs.entered, "the handlers to fill the limit")
		}
		start := time.Now()
		_, err := p.RoundTrip(testCtx(t), bs.addr, newRequest("one too many"))
		wantStatus(t, err, protocol.StatusServerThreadpoolExhausted, true, false)
		if !errors.Is(err, protocol.ErrOverloaded) {
			t.Errorf("errors.Is(err, protocol.ErrOverloaded) = false for %v", err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("the rejection took %v; it must come at once", d)
		}
		if n := bs.ran.Load(); n != limit {
			t.Errorf("%d handlers ran, want %d", n, limit)
		}
		close(bs.release)
		for range limit {
			if err := waitFor(t, results, "the blocked calls"); err != nil {
				t.Errorf("blocked call: %v", err)
			}
		}
	})
	// A caller that sends its next request as soon as it has the answer
	// never finds its finished call still holding the only slot.
	t.Run("sequential caller never finds its own slot taken", func(t *testing.T) {
		ts := startServer(t, echo, ServerConfig{MaxConcurrent: 1})
		p := newPool(t, Config{ConnsPerAddr: 1})
		for i := range 2000 {
			resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("next"))
			if err != nil {
				t.Fatalf("call %d: %v", i, err)
			}
			p.Release(resp)
		}
	})
}

func TestBudget(t *testing.T) {
	var ran atomic.Int32
	deadlines := make(chan time.Time, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		ran.Add(1)
		d, ok := ctx.Deadline()
		if !ok {
			d = time.Time{}
		}
		select {
		case deadlines <- d:
		default:
			t.Errorf("handler ran for %q with nobody waiting", req.Payload)
		}
	}), ServerConfig{})
	p := newPool(t, Config{})

	t.Run("spent", func(t *testing.T) {
		req := newRequest("late")
		req.Timeout = -1
		_, err := p.RoundTrip(testCtx(t), ts.addr, req)
		wantStatus(t, err, protocol.StatusServerTimeout, true, false)
		if n := ran.Load(); n != 0 {
			t.Errorf("the handler ran %d times for a spent budget", n)
		}
	})
	t.Run("deadline", func(t *testing.T) {
		const budget = 2 * time.Second
		req := newRequest("timed")
		req.Timeout = budget
		before := time.Now()
		resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
		after := time.Now()
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		p.Release(resp)
		d := waitFor(t, deadlines, "the handler's deadline")
		// Milliseconds on the wire: allow that rounding.
		if lo, hi := before.Add(budget-5*time.Millisecond), after.Add(budget); d.Before(lo) || d.After(hi) {
			t.Errorf("handler deadline %v not within [%v, %v]", d, lo, hi)
		}
	})
	t.Run("none", func(t *testing.T) {
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("untimed"))
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		p.Release(resp)
		if d := waitFor(t, deadlines, "the handler"); !d.IsZero() {
			t.Errorf("handler ctx has deadline %v without a budget", d)
		}
	})
}

func TestHandlerPanic(t *testing.T) {
	var logs lockedBuffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "panic" {
			resp.Payload = []byte("half-written")
			panic("boom")
		}
		echo(ctx, req, resp)
	}), ServerConfig{Logger: logger})
	p := newPool(t, Config{})
	ctx := testCtx(t)
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for i := range 32 {
		wg.Go(func() {
			want := fmt.Sprint("fine-", i)
			if i%8 == 0 {
				want = "panic"
			}
			resp, err := p.RoundTrip(ctx, ts.addr, newRequest(want))
			if want == "panic" {
				var pe *protocol.Error
				if !errors.As(err, &pe) || pe.Status != protocol.StatusServiceError || !pe.Remote {
					errs <- fmt.Errorf("panicking call: err = %v, want remote status 70", err)
				} else if !strings.Contains(pe.Msg, "boom") {
					errs <- fmt.Errorf("panicking call: message %q does not name the panic", pe.Msg)
				}
				return
			}
			if err != nil {
				errs <- fmt.Errorf("call %d next to a panic: %w", i, err)
				return
			}
			if string(resp.Payload) != want {
				errs <- fmt.Errorf("call %d got %q", i, resp.Payload)
			}
			p.Release(resp)
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	out := logs.String()
	if !strings.Contains(out, "handler panic") || !strings.Contains(out, "boom") || !strings.Contains(out, "goroutine") {
		t.Errorf("panic not logged with its stack; log:\n%s", out)
	}
}

// TestHandlerGoexit: a handler that ends its goroutine (runtime.Goexit, as
// t.FailNow does) is answered 70 like a panic, and gives its
// MaxConcurrent slot back: the next call runs and Shutdown does not wait
// for it.
func TestHandlerGoexit(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "goexit" {
			runtime.Goexit()
		}
		echo(ctx, req, resp)
	}), ServerConfig{MaxConcurrent: 1})
	p := newPool(t, Config{})
	_, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("goexit"))
	if pe := wantStatus(t, err, protocol.StatusServiceError, true, false); !strings.Contains(pe.Msg, "Goexit") {
		t.Errorf("status 70 says %q, want it to name runtime.Goexit", pe.Msg)
	}
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("after"))
	if err != nil {
		t.Fatalf("the call after the Goexit: %v (its slot was not released?)", err)
	}
	p.Release(resp)
	if err := ts.srv.Shutdown(testCtx(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
}

// TestWireFormatOfResponse checks a response frame byte by byte.
func TestWireFormatOfResponse(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		resp.Payload = []byte{0xAB}
	}), ServerConfig{})
	c := dialRaw(t, ts.addr)
	req := newRequest("x")
	req.Header.SetID(5)
	if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write: %v", err)
	}
	// header(16) + service "" + method "" + 0 attachments + payload.
	want := mustHex(t, "dabb 1614 0000000000000005 00000004 00 00 00 ab")
	got := readFull(t, c, len(want))
	if !bytes.Equal(got, want) {
		t.Errorf("response\n got % x\nwant % x", got, want)
	}
	if binary.BigEndian.Uint32(got[12:16]) != 4 {
		t.Errorf("body length %d", binary.BigEndian.Uint32(got[12:16]))
	}
}

// TestPutServerCallDropsAliasedPayload: a handler that answers with the
// request's own payload (a zero-copy echo) leaves resp.Payload in the
// request's array. The pooled call must not keep it as the next response
// buffer (the next read writes there) nor put it in the buffer pool a
// second time (the request's Recycle does, when it is large).
func TestPutServerCallDropsAliasedPayload(t *testing.T) {
	for _, size := range []int{1 << 10, 300 << 10} {
		frame := protocol.AppendMessage(nil, newRequest(strings.Repeat("x", size)))
		call := new(serverCall)
		rd := protocol.NewReader(bufio.NewReader(bytes.NewReader(frame)), 0)
		if err := rd.Read(&call.req); err != nil {
			t.Fatal(err)
		}
		body := call.req.Payload
		call.resp.Payload = body
		putServerCall(call)
		if sameArray(call.resp.Payload, body) {
			t.Errorf("%d-byte echo: the pooled call keeps the request's array as its response buffer", size)
		}
	}
}
