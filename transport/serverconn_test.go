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

	"github.com/dabbrpc/dabb/internal/wait"
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
	ids := make(chan string, 32)
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
				} else if id, ok := panicID(pe.Msg); !ok || strings.Contains(pe.Msg, "boom") {
					errs <- fmt.Errorf("panicking call: message %q, want \"handler panic (id …)\" without the panic's text", pe.Msg)
				} else {
					ids <- id
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
	close(ids)
	out := logs.String()
	if !strings.Contains(out, "handler panic") || !strings.Contains(out, "boom") || !strings.Contains(out, "goroutine") {
		t.Errorf("panic not logged with its stack; log:\n%s", out)
	}
	for id := range ids {
		if !strings.Contains(out, "id="+id) {
			t.Errorf("the caller's panic id %s is not in the server's log:\n%s", id, out)
		}
	}
}

// panicID returns the id in a "handler panic (id X)" message.
func panicID(msg string) (string, bool) {
	rest, ok := strings.CutPrefix(msg, "handler panic (id ")
	if !ok {
		return "", false
	}
	id, ok := strings.CutSuffix(rest, ")")
	return id, ok && len(id) == 16
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

func TestNilHandler(t *testing.T) {
	ts := startServer(t, nil, ServerConfig{})
	p := newPool(t, Config{})
	_, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
	wantStatus(t, err, protocol.StatusServiceNotFound, true, false)
}

// TestServerClosesAClientNotReading: a client that keeps sending requests
// but reads none of the responses is disconnected once maxQueued bytes of
// responses wait, instead of the server's memory growing without bound.
func TestServerClosesAClientNotReading(t *testing.T) {
	withMaxQueued(t, 256<<10)
	ts := startServer(t, echo, ServerConfig{})
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		req := newRequest(strings.Repeat("r", 32<<10))
		var frame []byte
		for id := uint64(1); ; id++ {
			req.Header.SetID(id)
			frame = protocol.AppendMessage(frame[:0], req)
			if _, err := nc.Write(frame); err != nil {
				return // the server closed the connection
			}
		}
	}()
	waitFor(t, closed, "the server to close the connection of a client that reads nothing")
}

// TestLargeResponsesGiveUpAtTheirDeadline: large responses to a client
// that stopped reading wait for the socket only until their requests'
// deadlines (their callers have given up by then); they used to wait, each
// holding its payload and its place in MaxConcurrent, until the stall
// check closed the connection.
func TestLargeResponsesGiveUpAtTheirDeadline(t *testing.T) {
	var handled atomic.Int64
	big := HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		resp.Payload = append(resp.Payload[:0], strings.Repeat("B", 4<<20)...)
		handled.Add(1)
	})
	ts := startServer(t, big, ServerConfig{})
	nc, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	req := newRequest("big, please")
	req.Timeout = 200 * time.Millisecond
	var frames []byte
	for id := range uint64(20) { // 80 MiB of responses: far more than the socket buffers hold
		req.Header.SetID(id + 1)
		frames = protocol.AppendMessage(frames, req)
	}
	if _, err := nc.Write(frames); err != nil {
		t.Fatal(err)
	}
	// Each response may wait out its own 200 ms in turn (4 s for all 20),
	// longer under -race on a loaded machine: the bound only has to tell
	// giving up from waiting forever.
	wait.Until(t, 30*time.Second, 5*time.Millisecond, "the responses waiting for the socket to give up", func() bool {
		return handled.Load() == 20 && ts.srv.active.Load() == 0
	})
}

// cancelBound is how soon a handler must see a cancel event: far less than
// the budgets in these tests, so a deadline cannot pass for one.
const cancelBound = time.Second

// handlerResult is what a gated handler saw when it returned.
type handlerResult struct {
	payload string
	err     error // ctx.Err() when the handler returned
	waited  time.Duration
	budget  bool // ctx had a deadline
}

// gatedServer runs handlers that report their payload on entered, then
// wait until release (for payloads starting with "block") or their ctx is
// done, report on results and echo "payload:ctx.Err()". Other payloads
// are echoed at once.
type gatedServer struct {
	*testServer
	entered chan string
	results chan handlerResult
	release chan struct{}
}

func startGatedServer(t *testing.T) *gatedServer {
	t.Helper()
	gs := &gatedServer{
		entered: make(chan string, 100),
		results: make(chan handlerResult, 100),
		release: make(chan struct{}),
	}
	gs.testServer = startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		payload := string(req.Payload)
		if len(payload) < 5 || payload[:5] != "block" {
			resp.Payload = append(resp.Payload[:0], req.Payload...)
			return
		}
		start := time.Now()
		gs.entered <- payload
		select {
		case <-gs.release:
		case <-ctx.Done():
		}
		_, budget := ctx.Deadline()
		gs.results <- handlerResult{payload: payload, err: ctx.Err(), waited: time.Since(start), budget: budget}
		resp.Payload = fmt.Appendf(resp.Payload[:0], "%s:%v", payload, ctx.Err())
	}), ServerConfig{})
	return gs
}

func TestCancelStopsHandler(t *testing.T) {
	for _, tt := range []struct {
		name   string
		budget time.Duration
	}{
		{"no budget", 0},
		{"10s budget", 10 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gs := startGatedServer(t)
			p := newPool(t, Config{ConnsPerAddr: 1})
			ctx, cancel := context.WithCancel(testCtx(t))
			defer cancel()
			req := newRequest("block")
			req.Timeout = tt.budget
			errc := make(chan error, 1)
			go func() {
				_, err := p.RoundTrip(ctx, gs.addr, req)
				errc <- err
			}()
			waitFor(t, gs.entered, "the handler to start")
			cancel()
			err := waitFor(t, errc, "RoundTrip to return")
			wantStatus(t, err, protocol.StatusClientError, false, false)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("err = %v, want it to wrap context.Canceled", err)
			}

			select {
			case r := <-gs.results:
				if !errors.Is(r.err, context.Canceled) {
					t.Errorf("handler's ctx.Err() = %v, want context.Canceled", r.err)
				}
				if r.budget != (tt.budget > 0) {
					t.Errorf("handler ctx has a deadline: %v, want %v", r.budget, tt.budget > 0)
				}
			case <-time.After(cancelBound):
				t.Fatalf("the handler did not see the cancel within %v", cancelBound)
			}

			// The connection keeps working.
			resp, err := p.RoundTrip(testCtx(t), gs.addr, newRequest("after"))
			if err != nil {
				t.Fatalf("call after a cancel: %v", err)
			}
			if string(resp.Payload) != "after" {
				t.Errorf("got %q, want %q", resp.Payload, "after")
			}
			p.Release(resp)
		})
	}
}

// rawCall writes a two-way request with the given id and payload.
func rawCall(t *testing.T, c net.Conn, id uint64, payload string, budget time.Duration) {
	t.Helper()
	req := newRequest(payload)
	req.Header.SetID(id)
	req.Timeout = budget
	if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write request %d: %v", id, err)
	}
}

func rawCancel(t *testing.T, c net.Conn, id uint64) {
	t.Helper()
	if _, err := c.Write(protocol.AppendCancel(nil, id)); err != nil {
		t.Fatalf("write cancel %d: %v", id, err)
	}
}

// expectNoResponse checks that the server wrote nothing on c for the
// calls it finished: once no handler holds a slot, every response the
// server will ever write is in its writer, so the answer to a heartbeat
// sent now must be the next frame.
func expectNoResponse(t *testing.T, srv *Server, c net.Conn, rd *protocol.Reader, hbID uint64) {
	t.Helper()
	eventually(t, "the handlers to finish", func() bool { return srv.active.Load() == 0 })
	if _, err := c.Write(protocol.AppendHeartbeat(nil, hbID)); err != nil {
		t.Fatalf("write heartbeat: %v", err)
	}
	m := readResponse(t, rd, c)
	if !m.IsHeartbeatResponse() || m.Header.ID() != hbID {
		t.Fatalf("got a frame with flags %#02x, status %d, id %d, payload %q; want only the heartbeat response %d",
			byte(m.Header.Flags()), m.Header.Status(), m.Header.ID(), m.Payload, hbID)
	}
}

func TestCancelRaw(t *testing.T) {
	t.Run("cancelled call is not answered", func(t *testing.T) {
		gs := startGatedServer(t)
		c := dialRaw(t, gs.addr)
		rd := protocol.NewReader(bufio.NewReader(c), 0)
		rawCall(t, c, 5, "block", 10*time.Second)
		waitFor(t, gs.entered, "the handler")
		start := time.Now()
		rawCancel(t, c, 5)
		r := waitFor(t, gs.results, "the handler to return")
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("handler's ctx.Err() = %v, want context.Canceled", r.err)
		}
		if d := time.Since(start); d > cancelBound {
			t.Errorf("the handler returned %v after the cancel", d)
		}
		expectNoResponse(t, gs.srv, c, rd, 6)
	})

	t.Run("unknown id is ignored", func(t *testing.T) {
		gs := startGatedServer(t)
		c := dialRaw(t, gs.addr)
		rd := protocol.NewReader(bufio.NewReader(c), 0)
		rawCall(t, c, 1, "block", 0)
		waitFor(t, gs.entered, "the handler")
		rawCancel(t, c, 99)
		rawCancel(t, c, 0)
		// The reader handles frames in order: once the heartbeat is
		// answered, both cancels were processed.
		if _, err := c.Write(protocol.AppendHeartbeat(nil, 100)); err != nil {
			t.Fatal(err)
		}
		if m := readResponse(t, rd, c); !m.IsHeartbeatResponse() || m.Header.ID() != 100 {
			t.Fatalf("got flags %#02x id %d, want the heartbeat response", byte(m.Header.Flags()), m.Header.ID())
		}
		close(gs.release)
		if r := waitFor(t, gs.results, "the handler"); r.err != nil {
			t.Errorf("handler's ctx.Err() = %v after cancels for other ids, want nil", r.err)
		}
		m := readResponse(t, rd, c)
		if m.Header.ID() != 1 || m.Header.Status() != protocol.StatusOK || string(m.Payload) != "block:<nil>" {
			t.Errorf("got id %d status %d payload %q, want id 1, OK, %q", m.Header.ID(), m.Header.Status(), m.Payload, "block:<nil>")
		}
	})

	t.Run("same id on another connection is not touched", func(t *testing.T) {
		gs := startGatedServer(t)
		a, b := dialRaw(t, gs.addr), dialRaw(t, gs.addr)
		rdA, rdB := protocol.NewReader(bufio.NewReader(a), 0), protocol.NewReader(bufio.NewReader(b), 0)
		rawCall(t, a, 1, "block-a", 0)
		waitFor(t, gs.entered, "handler a")
		rawCall(t, b, 1, "block-b", 0)
		waitFor(t, gs.entered, "handler b")
		rawCancel(t, b, 1)
		r := waitFor(t, gs.results, "a handler to return")
		if r.payload != "block-b" || !errors.Is(r.err, context.Canceled) {
			t.Fatalf("handler %q returned with %v; want block-b, cancelled", r.payload, r.err)
		}
		eventually(t, "call b to finish", func() bool { return gs.srv.active.Load() == 1 })
		expectNoResponseBusy(t, b, rdB, 2)

		close(gs.release)
		if r := waitFor(t, gs.results, "handler a"); r.payload != "block-a" || r.err != nil {
			t.Errorf("handler %q returned with ctx.Err() = %v; want block-a, nil", r.payload, r.err)
		}
		m := readResponse(t, rdA, a)
		if m.Header.ID() != 1 || m.Header.Status() != protocol.StatusOK || string(m.Payload) != "block-a:<nil>" {
			t.Errorf("connection a got id %d status %d payload %q", m.Header.ID(), m.Header.Status(), m.Payload)
		}
	})

	t.Run("cancel right behind the request", func(t *testing.T) {
		// Request and cancel in one write: the handler either never runs
		// or sees the cancel; either way nothing is answered.
		gs := startGatedServer(t)
		c := dialRaw(t, gs.addr)
		rd := protocol.NewReader(bufio.NewReader(c), 0)
		var frames []byte
		const n = 20
		for id := uint64(1); id <= n; id++ {
			req := newRequest("block")
			req.Header.SetID(id)
			frames = protocol.AppendMessage(frames, req)
			frames = protocol.AppendCancel(frames, id)
		}
		if _, err := c.Write(frames); err != nil {
			t.Fatal(err)
		}
		expectNoResponse(t, gs.srv, c, rd, 1000)
		ran := len(gs.results)
		for range ran {
			if r := <-gs.results; !errors.Is(r.err, context.Canceled) {
				t.Errorf("a handler that ran saw ctx.Err() = %v, want context.Canceled", r.err)
			}
		}
		t.Logf("%d of %d handlers started before their cancel was read", ran, n)
	})

	t.Run("one-way requests are not cancellable", func(t *testing.T) {
		gs := startGatedServer(t)
		c := dialRaw(t, gs.addr)
		req := newRequest("block-oneway")
		req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest, 22))
		req.Header.SetID(3)
		if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, gs.entered, "the one-way handler")
		rawCancel(t, c, 3)
		rd := protocol.NewReader(bufio.NewReader(c), 0)
		if _, err := c.Write(protocol.AppendHeartbeat(nil, 4)); err != nil {
			t.Fatal(err)
		}
		if m := readResponse(t, rd, c); !m.IsHeartbeatResponse() {
			t.Fatalf("got flags %#02x, want the heartbeat response", byte(m.Header.Flags()))
		}
		close(gs.release)
		if r := waitFor(t, gs.results, "the one-way handler"); r.err != nil {
			t.Errorf("one-way handler saw ctx.Err() = %v, want nil", r.err)
		}
	})
}

// expectNoResponseBusy is expectNoResponse while other calls still run:
// the caller has waited until the cancelled call released its slot.
func expectNoResponseBusy(t *testing.T, c net.Conn, rd *protocol.Reader, hbID uint64) {
	t.Helper()
	if _, err := c.Write(protocol.AppendHeartbeat(nil, hbID)); err != nil {
		t.Fatalf("write heartbeat: %v", err)
	}
	m := readResponse(t, rd, c)
	if !m.IsHeartbeatResponse() || m.Header.ID() != hbID {
		t.Fatalf("got a frame with flags %#02x, status %d, id %d, payload %q; want only the heartbeat response %d",
			byte(m.Header.Flags()), m.Header.Status(), m.Header.ID(), m.Payload, hbID)
	}
}

// TestDisconnectCancelsRunningCalls: when a client's connection goes, the
// handlers still running for it are cancelled, as if it had sent the
// cancel event for each: nobody is left to read their answers.
func TestDisconnectCancelsRunningCalls(t *testing.T) {
	gs := startGatedServer(t)
	c := dialRaw(t, gs.addr)
	rawCall(t, c, 1, "block-1", 10*time.Second)
	rawCall(t, c, 2, "block-2", 0)
	waitFor(t, gs.entered, "the first handler")
	waitFor(t, gs.entered, "the second handler")
	start := time.Now()
	c.Close()
	for range 2 {
		r := waitFor(t, gs.results, "a handler to return")
		if !errors.Is(r.err, context.Canceled) {
			t.Errorf("%s: handler's ctx.Err() = %v, want context.Canceled", r.payload, r.err)
		}
	}
	if d := time.Since(start); d > cancelBound {
		t.Errorf("the handlers returned %v after the disconnect", d)
	}
	// The server goes on serving other connections.
	p := newPool(t, Config{})
	resp, err := p.RoundTrip(testCtx(t), gs.addr, newRequest("still here"))
	if err != nil {
		t.Fatal(err)
	}
	if string(resp.Payload) != "still here" {
		t.Fatalf("echo %q", resp.Payload)
	}
	p.Release(resp)
}

// dubboRequest is a Dubbo consumer's hessian2 request, as Java Dubbo
// writes one: the Dubbo version, the path, the service version, the
// method, the parameter types, the arguments and the attachments map.
func dubboRequest(id uint64) []byte {
	var body []byte
	for _, s := range []string{"2.0.2", "org.example.Greeter", "0.0.0", "sayHello", "Ljava/lang/String;", "world"} {
		body = protocol.AppendHessianString(body, s)
	}
	body = append(body, 'H')
	body = protocol.AppendHessianString(body, "path")
	body = protocol.AppendHessianString(body, "org.example.Greeter")
	body = append(body, 'Z')
	return rawFrame(id, protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, protocol.Hessian2), body)
}

// TestForeignSerializationAnswered: a request in a serialization the
// server does not read (a Dubbo consumer's hessian2) is answered 40
// before its body is parsed, with the reason as a hessian2 string, as
// Dubbo writes an error. The connection stays in step, and the peer is
// logged once.
func TestForeignSerializationAnswered(t *testing.T) {
	var logs lockedBuffer
	ts := startServer(t, echo, ServerConfig{
		Serializations: func(id byte) bool { return id == 22 },
		Logger:         slog.New(slog.NewTextHandler(&logs, nil)),
	})
	c := dialRaw(t, ts.addr)
	br := bufio.NewReader(c)
	for _, id := range []uint64{7, 8} {
		if _, err := c.Write(dubboRequest(id)); err != nil {
			t.Fatal(err)
		}
		var h protocol.Header
		if _, err := io.ReadFull(br, h[:]); err != nil {
			t.Fatalf("reading the answer: %v", err)
		}
		if h.ID() != id || h.Status() != protocol.StatusBadRequest || h.Flags().IsRequest() || h.Flags().Serialization() != protocol.Hessian2 {
			t.Fatalf("answer header % x: want a hessian2 response to %d with status 40", h[:], id)
		}
		body := make([]byte, h.BodyLen())
		if _, err := io.ReadFull(br, body); err != nil {
			t.Fatal(err)
		}
		msg, rest, err := protocol.DecodeHessianString(body)
		if err != nil || len(rest) != 0 {
			t.Fatalf("the body is not one hessian2 string (rest %q): %v", rest, err)
		}
		if !strings.Contains(msg, "dabb server") || !strings.Contains(msg, "hessian2 (id 2)") {
			t.Fatalf("the answer says %q; want it to name dabb and the serialization", msg)
		}
	}
	// In step: a dabb request on the same connection is served.
	ok := newRequest("ok")
	ok.Header.SetID(9)
	if _, err := c.Write(protocol.AppendMessage(nil, ok)); err != nil {
		t.Fatal(err)
	}
	m := readResponse(t, protocol.NewReader(br, 0), c)
	if m.Header.ID() != 9 || m.Header.Status() != protocol.StatusOK || string(m.Payload) != "ok" {
		t.Fatalf("after the foreign requests: id %d status %d payload %q", m.Header.ID(), m.Header.Status(), m.Payload)
	}
	if n := strings.Count(logs.String(), "does not read"); n != 1 {
		t.Errorf("the server logged the peer %d times, want once:\n%s", n, logs.String())
	}
}
