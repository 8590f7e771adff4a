package transport

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// readerGoroutines counts the goroutines reading a server connection.
func readerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "transport.(*serverConn).read(")
}

// inlineRuns returns how many calls s ran on their reader.
func inlineRuns(s *Server) uint64 {
	s.inline.mu.Lock()
	defer s.inline.mu.Unlock()
	return s.inline.runs
}

// Sequential calls, each alone on its connection, run on the reader.
func TestInlineCallsRunOnTheReader(t *testing.T) {
	// An echo can take over inlineQuick on a loaded machine, which would
	// send the next calls to workers: that rule has its own test.
	ts := startServer(t, echo, ServerConfig{inlineQuick: time.Hour})
	p := newPool(t, Config{ConnsPerAddr: 1})
	const calls = 100
	for i := range calls {
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		p.Release(resp)
	}
	if n := inlineRuns(ts.srv); n != calls {
		t.Fatalf("%d of %d sequential calls ran on the reader, want all", n, calls)
	}
}

// After a call run on the reader took longer than inlineQuick (its
// handler waited), the next calls of the connection go to workers.
func TestSlowInlineCallSendsNextToWorkers(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "slow" {
			time.Sleep(3 * inlineQuick)
		}
		echo(ctx, req, resp)
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	call := func(payload string) {
		t.Helper()
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest(payload))
		if err != nil {
			t.Fatalf("call %s: %v", payload, err)
		}
		p.Release(resp)
	}
	call("slow")
	if n := inlineRuns(ts.srv); n != 1 {
		t.Fatalf("the first call did not run on the reader (%d runs)", n)
	}
	for range inlineSkip {
		call("fast")
	}
	if n := inlineRuns(ts.srv); n != 1 {
		t.Fatalf("%d calls ran on the reader after a slow one, want none of the next %d", n-1, inlineSkip)
	}
	call("fast")
	if n := inlineRuns(ts.srv); n != 2 {
		t.Fatalf("after %d calls on workers, the next did not run on the reader (%d runs)", inlineSkip, n)
	}
}

// A call that runs long on the reader does not hold back the next frame
// of its connection: the reading moves to a new goroutine, which serves
// the next call while the first still runs, and the first goroutine ends
// after its call.
func TestSlowInlineCallHandsReadingOn(t *testing.T) {
	release := make(chan struct{})
	var running atomic.Int32
	h := HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "slow" {
			running.Add(1)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		echo(ctx, req, resp)
	})
	ts := startServer(t, h, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	slow := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("slow"))
		if err == nil {
			p.Release(resp)
		}
		slow <- err
	}()
	eventually(t, "the slow call to run", func() bool { return running.Load() == 1 })
	start := time.Now()
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("fast"))
	if err != nil {
		t.Fatalf("the call beside the slow one: %v", err)
	}
	p.Release(resp)
	if d := time.Since(start); d > time.Second {
		t.Errorf("the call beside the slow one took %v", d)
	}
	if readers := readerGoroutines(); readers != 2 {
		// One reads the connection, one runs the slow call (it read it).
		t.Errorf("%d reader goroutines while the slow call ran, want 2", readers)
	}
	close(release)
	if err := <-slow; err != nil {
		t.Fatalf("the slow call: %v", err)
	}
	eventually(t, "the reader that ran the slow call to end", func() bool { return readerGoroutines() == 1 })
	// The new reader reads on; the goroutine that ran the slow call left
	// the reading state alone (the race detector watches).
	for range 3 {
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("after"))
		if err != nil {
			t.Fatalf("a call after the slow one: %v", err)
		}
		p.Release(resp)
	}
}

// A handler that ends its goroutine while it runs on the reader is
// answered 70, and the connection reads on: the next call on it works.
func TestInlineGoexitKeepsTheConnection(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "goexit" {
			runtime.Goexit()
		}
		echo(ctx, req, resp)
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	_, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("goexit"))
	wantStatus(t, err, protocol.StatusServiceError, true, false)
	opened := ts.srv.openConns()
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("after"))
	if err != nil {
		t.Fatalf("the call after the Goexit: %v", err)
	}
	p.Release(resp)
	if got := ts.srv.openConns(); len(opened) != 1 || len(got) != 1 || got[0] != opened[0] {
		t.Fatalf("connections %v then %v, want the same one", opened, got)
	}
	eventually(t, "one reader", func() bool { return readerGoroutines() == 1 })
}

// A call run on the reader is cancelled by the client's cancel event: the
// reading moves on, reads the event, and the handler sees its context end.
func TestInlineCallCancelled(t *testing.T) {
	done := make(chan error, 1)
	started := make(chan struct{})
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		close(started)
		select {
		case <-ctx.Done():
			done <- ctx.Err()
		case <-time.After(defaultTestTimeout):
			done <- nil
		}
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() {
		<-started
		cancel()
	}()
	_, err := p.RoundTrip(ctx, ts.addr, newRequest("x"))
	if err == nil {
		t.Fatal("the cancelled call returned no error")
	}
	if got := <-done; got != context.Canceled {
		t.Fatalf("the handler's context ended with %v, want context.Canceled", got)
	}
}
