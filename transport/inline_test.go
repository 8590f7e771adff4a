package transport

import (
	"context"
	"fmt"
	"net"
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
	// On a loaded machine an echo can take over inlineQuick, or be seen
	// by two of the watch's looks, either of which sends the next calls
	// to workers: those rules have their own tests.
	ts := startServer(t, echo, ServerConfig{inlineQuick: time.Hour, inlinePeriod: time.Hour})
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

// After a call run on the reader took longer than inlineQuick while a
// frame of its connection waited behind it, the next inlineSkip requests
// of the connection go to workers.
func TestSlowInlineCallSendsNextToWorkers(t *testing.T) {
	started, release := make(chan struct{}), make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "slow" {
			close(started)
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		echo(ctx, req, resp)
	})
	// The watch stays away: this test is about the rule after the call.
	// The slow call takes at least as long as the peek below, which
	// inlineQuick is shorter than.
	ts := startServer(t, h, ServerConfig{inlineQuick: time.Microsecond, inlinePeriod: time.Hour})
	c, rd := serveRaw(t, ts.addr)
	writeCall(t, c, 1, "slow")
	select {
	case <-started:
	case <-time.After(defaultTestTimeout):
		t.Fatal("the slow call did not start")
	}
	writeCall(t, c, 2, "fast")
	rc := rawConnOf(onlyConn(t, ts.srv).nc)
	eventually(t, "the second request to reach the server's socket", func() bool { return socketPending(rc) })
	close(release)
	for want := uint64(1); want <= 2; want++ {
		if m := readResponse(t, rd, c); m.Header.ID() != want {
			t.Fatalf("answer %d, want %d", m.Header.ID(), want)
		}
	}
	id := uint64(2)
	call := func() {
		t.Helper()
		id++
		writeCall(t, c, id, "fast")
		if m := readResponse(t, rd, c); m.Header.ID() != id {
			t.Fatalf("answer %d, want %d", m.Header.ID(), id)
		}
	}
	for range inlineSkip - 1 { // the request that waited was the first
		call()
	}
	if n := inlineRuns(ts.srv); n != 1 {
		t.Fatalf("%d calls ran on the reader after a slow one, want none of the next %d", n-1, inlineSkip)
	}
	// A worker books its call's end after the answer left: the next
	// request may find it still counted, and run on a worker.
	sc := onlyConn(t, ts.srv)
	eventually(t, "the calls on workers to end", func() bool { return sc.inflight.Load() == 0 })
	call()
	if n := inlineRuns(ts.srv); n != 2 {
		t.Fatalf("after %d calls on workers, the next did not run on the reader (%d runs)", inlineSkip, n)
	}
}

// A slow call with nothing behind it on its connection held back no one:
// the connection's next call still runs on the reader.
func TestSlowLoneCallKeepsTheReader(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "slow" {
			time.Sleep(3 * inlineQuick)
		}
		echo(ctx, req, resp)
	}), ServerConfig{inlinePeriod: time.Hour})
	c, rd := serveRaw(t, ts.addr)
	if rawConnOf(onlyConn(t, ts.srv).nc) == nil {
		t.Skip("the socket cannot be looked at here: a slow call sends the next ones to workers")
	}
	for id, p := range []string{"slow", "fast"} {
		writeCall(t, c, uint64(id+1), p)
		if m := readResponse(t, rd, c); m.Header.ID() != uint64(id+1) {
			t.Fatalf("answer %d, want %d", m.Header.ID(), id+1)
		}
	}
	if n := inlineRuns(ts.srv); n != 2 {
		t.Fatalf("%d of 2 sequential calls ran on the reader, want both: nothing waited behind the slow one", n)
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
	// One reads the connection, one runs the slow call (it read it). On a
	// loaded machine the watch may have moved the fast call on too: the
	// goroutine that ran it ends after its answer.
	eventually(t, "2 reader goroutines while the slow call runs", func() bool { return readerGoroutines() == 2 })
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

// writeBurst writes one request per payload, ids 1 up, in one write, so
// the server reads them in one burst.
func writeBurst(t *testing.T, c net.Conn, payloads ...string) {
	t.Helper()
	var b []byte
	for i, p := range payloads {
		req := newRequest(p)
		req.Header.SetID(uint64(i + 1))
		b = protocol.AppendMessage(b, req)
	}
	if _, err := c.Write(b); err != nil {
		t.Fatalf("write the burst: %v", err)
	}
}

// writeCall writes one request with id and payload on c.
func writeCall(t *testing.T, c net.Conn, id uint64, payload string) {
	t.Helper()
	req := newRequest(payload)
	req.Header.SetID(id)
	if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write request %d: %v", id, err)
	}
}

// onlyConn returns s's one open connection.
func onlyConn(t *testing.T, s *Server) *serverConn {
	t.Helper()
	conns := s.openConns()
	if len(conns) != 1 {
		t.Fatalf("%d server connections, want 1", len(conns))
	}
	return conns[0]
}

// writesSince waits until the connection's writer has made more than base
// writes and is idle, and returns how many it made after base. The peer
// may read a write's bytes before the writer books it.
func writesSince(t *testing.T, sc *serverConn, base uint64) uint64 {
	t.Helper()
	var n uint64
	eventually(t, "the writer to book a write and be idle", func() bool {
		sc.w.mu.Lock()
		defer sc.w.mu.Unlock()
		n = sc.w.writes - base
		return n > 0 && !sc.w.flushing
	})
	return n
}

// The requests of a burst run one after the other on the reader, and
// their answers leave in one write when the reader found the burst
// without waiting, as on a saturated connection (burstGap).
func TestBurstRunsOnTheReaderInOneWrite(t *testing.T) {
	if got := burstWrites(t, time.Hour); got != 1 {
		t.Errorf("the burst's answers took %d writes, want 1", got)
	}
}

// The first burstHead answers of a burst the reader waited for leave at
// once, and the rest together after them: two writes.
func TestWaitedBurstHeadLeavesFirst(t *testing.T) {
	if got := burstWrites(t, time.Nanosecond); got != 2 {
		t.Errorf("the answers of a burst the reader waited for took %d writes, want 2 (the first %d, then the rest)", got, burstHead)
	}
}

// burstWrites sends a burst of 8 requests, all run on the reader, to a
// server whose readers count a wait over gap as waiting for a burst, and
// returns the writes its answers took.
func burstWrites(t *testing.T, gap time.Duration) uint64 {
	t.Helper()
	ts := startServer(t, echo, ServerConfig{inlineQuick: time.Hour, inlinePeriod: time.Hour, burstGap: gap})
	c, rd := serveRaw(t, ts.addr)
	sc := onlyConn(t, ts.srv)
	// The heartbeat serveRaw exchanged was the connection's first write.
	writes := writesSince(t, sc, 0)
	const n = 8
	payloads := make([]string, n)
	for i := range payloads {
		payloads[i] = fmt.Sprint("call ", i+1)
	}
	writeBurst(t, c, payloads...)
	for i := range n {
		m := readResponse(t, rd, c)
		if m.Header.ID() != uint64(i+1) || string(m.Payload) != payloads[i] {
			t.Fatalf("answer %d: id %d, payload %q; want id %d, %q", i, m.Header.ID(), m.Payload, i+1, payloads[i])
		}
	}
	if runs := inlineRuns(ts.srv); runs != n {
		t.Errorf("%d of the burst's %d calls ran on the reader, want all", runs, n)
	}
	return writesSince(t, sc, writes)
}

// The calls of a burst run on the reader only while together they took
// under inlineQuick: the frames behind them wait for them. Each call is
// well under the watch's period, which would move the reading on by
// itself.
func TestBurstOverQuickGoesToWorkers(t *testing.T) {
	const quick = 300 * time.Microsecond
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		// A sleep this short may take a millisecond: spin instead.
		for start := time.Now(); time.Since(start) < quick*2/3; {
		}
		echo(ctx, req, resp)
	}), ServerConfig{inlineQuick: quick})
	c, rd := serveRaw(t, ts.addr)
	writeBurst(t, c, "a", "b", "c", "d")
	got := map[uint64]bool{}
	for range 4 {
		got[readResponse(t, rd, c).Header.ID()] = true
	}
	if len(got) != 4 {
		t.Fatalf("answers for ids %v, want 1 to 4", got)
	}
	// Two calls took over quick together, so the third and fourth went to
	// workers (only one, if the first call's sleep overran by half).
	if runs := inlineRuns(ts.srv); runs > 2 {
		t.Errorf("%d of 4 calls of %v each ran on the reader, want at most 2 within %v", runs, quick*2/3, quick)
	}
}

// A call of a burst that runs long does not hold back the answers of the
// others: the reading moves on, and the answers held for the burst leave
// while the long call still runs.
func TestSlowCallInBurstHoldsNoAnswers(t *testing.T) {
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if string(req.Payload) == "slow" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		echo(ctx, req, resp)
	})
	ts := startServer(t, h, ServerConfig{inlineQuick: time.Hour})
	c, rd := serveRaw(t, ts.addr)
	writeBurst(t, c, "before", "slow", "after")
	first, second := readResponse(t, rd, c), readResponse(t, rd, c)
	if ids := [2]uint64{first.Header.ID(), second.Header.ID()}; ids != [2]uint64{1, 3} && ids != [2]uint64{3, 1} {
		t.Fatalf("answers %v came while the slow call ran, want 1 and 3", ids)
	}
	close(release)
	if m := readResponse(t, rd, c); m.Header.ID() != 2 {
		t.Fatalf("answer %d came last, want the slow call's, 2", m.Header.ID())
	}
}
