package transport

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
)

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
	wait.Until(t, 5*time.Second, 5*time.Millisecond, "the responses waiting for the socket to give up", func() bool {
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
