package transport

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"runtime"
	"strconv"
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

func manyAttachments(n int) map[string]string {
	m := make(map[string]string, n)
	for i := range n {
		m["k"+strconv.Itoa(i)] = "v"
	}
	return m
}

// TestAttachmentLimit: neither side sends a frame with more attachments
// than a receiver accepts (protocol.MaxAttachments). A request over it
// fails locally, not sent; a handler's response over it is answered with
// 50 instead, and the connection, with the calls sharing it, lives on.
func TestAttachmentLimit(t *testing.T) {
	l := &acceptCounter{Listener: listen(t)}
	ts := startServerOn(t, l, HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "flood" {
			resp.Attachments = manyAttachments(protocol.MaxAttachments + 1)
		}
		resp.Payload = append(resp.Payload[:0], req.Payload...)
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})

	req := newRequest("x")
	req.Attachments = manyAttachments(protocol.MaxAttachments + 1)
	_, err := p.RoundTrip(testCtx(t), ts.addr, req)
	var pe *protocol.Error
	if !errors.Is(err, ErrNotSent) || !errors.Is(err, protocol.ErrTooManyAttachments) ||
		!errors.As(err, &pe) || pe.Status != protocol.StatusClientError || pe.Remote {
		t.Errorf("a request with %d attachments = %v; want a local 90, not sent, wrapping ErrTooManyAttachments",
			protocol.MaxAttachments+1, err)
	}
	req.Attachments = manyAttachments(protocol.MaxAttachments)
	resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
	if err != nil {
		t.Fatalf("a request with %d attachments: %v", protocol.MaxAttachments, err)
	}
	p.Release(resp)

	_, err = p.RoundTrip(testCtx(t), ts.addr, newRequest("flood"))
	if !errors.As(err, &pe) || pe.Status != protocol.StatusBadResponse || !pe.Remote {
		t.Fatalf("a call whose handler answered %d attachments = %v; want a remote 50", protocol.MaxAttachments+1, err)
	}
	resp, err = p.RoundTrip(testCtx(t), ts.addr, newRequest("after"))
	if err != nil {
		t.Fatalf("the call after it: %v", err)
	}
	p.Release(resp)
	if n := l.accepted.Load(); n != 1 {
		t.Errorf("the server accepted %d connections; want the one to live on", n)
	}
}

// BenchmarkRoundTrip measures one round trip over loopback, client and
// server together (both run in this process, so allocs/op counts both).
// Besides ns/op it reports writes/op, the write system calls of both sides
// per round trip (2 when nothing coalesces; Linux only, from /proc/self/io,
// so the runtime's own wake-up writes count too), and cpu-ns/op, the
// process's CPU time per round trip, which a busy machine disturbs less than
// wall time. The connections are plain TCP ones, so the writer takes the
// path it takes in production (see rawWriter.init).
func BenchmarkRoundTrip(b *testing.B) {
	handler := HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		resp.Payload = req.Payload
	})
	payload := make([]byte, 64)
	for _, bc := range []struct {
		name    string
		par     int // goroutines; 1 runs serially
		timeout bool
	}{
		{"p1", 1, false},
		{"p1-budget", 1, true},
		{"p64", 64, false},
		{"p64-budget", 64, true},
	} {
		b.Run(bc.name, func(b *testing.B) {
			ts := startServerOn(b, listen(b), handler, ServerConfig{})
			p := newPool(b, Config{})
			ctx := context.Background()
			newReq := func() *protocol.Message {
				req := &protocol.Message{Service: "bench.Echo", Method: "Echo", Payload: payload}
				req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22))
				if bc.timeout {
					req.Timeout = defaultTestTimeout
				}
				return req
			}
			// Warm up both connections of the pool.
			for range 4 {
				warm, err := p.RoundTrip(ctx, ts.addr, newReq())
				if err != nil {
					b.Fatalf("warm-up: %v", err)
				}
				p.Release(warm)
			}
			b.ReportAllocs()
			writes0, counted := writeSyscalls()
			cpu0 := cpuTime()
			b.ResetTimer()
			if bc.par == 1 {
				req := newReq()
				for b.Loop() {
					resp, err := p.RoundTrip(ctx, ts.addr, req)
					if err != nil {
						b.Fatal(err)
					}
					p.Release(resp)
				}
			} else {
				b.SetParallelism(max(1, bc.par/runtime.GOMAXPROCS(0)))
				b.RunParallel(func(pb *testing.PB) {
					req := newReq()
					for pb.Next() {
						resp, err := p.RoundTrip(ctx, ts.addr, req)
						if err != nil {
							b.Error(err)
							return
						}
						p.Release(resp)
					}
				})
			}
			b.StopTimer()
			if writes, ok := writeSyscalls(); ok && counted {
				b.ReportMetric(float64(writes-writes0)/float64(b.N), "writes/op")
			}
			b.ReportMetric(float64(cpuTime()-cpu0)/float64(b.N), "cpu-ns/op")
		})
	}
}

// TestReadOnlyIsAQuestion: ReadOnly, asked on every pick, allocates
// nothing, dials nothing, and learns of no address it is asked about.
func TestReadOnlyIsAQuestion(t *testing.T) {
	var d countingDial
	p := newPool(t, Config{ConnsPerAddr: 1, Dial: d.dial})
	addr, _, c := readOnlyAddr(t, p)
	defer c.Close() // the old server keeps draining: no probe is due
	dials := d.n.Load()
	allocs := testing.AllocsPerRun(1000, func() {
		if !p.ReadOnly(addr) {
			t.Fatal("ReadOnly = false for a read-only address")
		}
		if p.ReadOnly("127.0.0.1:1") {
			t.Fatal("ReadOnly = true for an address never called")
		}
	})
	if allocs != 0 {
		t.Errorf("ReadOnly allocates %.1f times per call, want 0", allocs)
	}
	if n := d.n.Load(); n != dials {
		t.Errorf("asking ReadOnly made %d dials", n-dials)
	}
	if n := len(*p.eps.Load()); n != 1 {
		t.Errorf("the pool knows %d addresses after ReadOnly was asked about another, want 1", n)
	}
}
