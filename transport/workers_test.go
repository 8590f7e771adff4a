// Tests of the server's worker pool.

package transport

import (
	"bufio"
	"context"
	"net"
	"runtime"
	"runtime/metrics"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func (s *Server) idleCount() int {
	s.workers.mu.Lock()
	defer s.workers.mu.Unlock()
	return len(s.workers.idle)
}

// workerGoroutines counts the goroutines running Server.worker.
func workerGoroutines() int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	return strings.Count(string(buf), "transport.(*workers).worker(")
}

// An idle worker is reused for the next request, survives one reap (it
// has not been idle for a whole period yet), exits at the second, and a
// request after that starts a new one.
func TestWorkersReaped(t *testing.T) {
	// Calls alone on their connection run on its reader: these go to
	// workers, whose pool is under test.
	ts := startServer(t, echo, ServerConfig{noInline: true})
	p := newPool(t, Config{})
	call := func() {
		t.Helper()
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		p.Release(resp)
	}
	s := ts.srv
	// Earlier tests' servers are closed, but Close does not wait for
	// their workers to exit (WaitForHandlers is off): let them go first.
	eventually(t, "earlier tests' workers to exit", func() bool { return workerGoroutines() == 0 })
	before := workerGoroutines()
	call()
	eventually(t, "the worker is idle", func() bool { return s.idleCount() == 1 })
	call()
	eventually(t, "the worker is idle again", func() bool { return s.idleCount() == 1 })
	if got := workerGoroutines() - before; got != 1 {
		t.Fatalf("%d worker goroutines after two sequential calls, want 1 (reused)", got)
	}
	s.workers.reap()
	if got := s.idleCount(); got != 1 {
		t.Fatalf("first reap left %d idle workers, want 1: it went idle in this period", got)
	}
	s.workers.reap()
	if got := s.idleCount(); got != 0 {
		t.Fatalf("second reap left %d idle workers, want 0", got)
	}
	eventually(t, "the reaped worker exits", func() bool { return workerGoroutines() == before })
	call()
	eventually(t, "a new worker is idle", func() bool { return s.idleCount() == 1 })
}

// Close makes idle workers exit (the package's goleak check would catch
// one left behind) and busy ones once their call is done.
func TestCloseStopsIdleWorkers(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{noInline: true})
	p := newPool(t, Config{})
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	p.Release(resp)
	eventually(t, "the worker is idle", func() bool { return ts.srv.idleCount() == 1 })
	if err := ts.srv.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if got := ts.srv.idleCount(); got != 0 {
		t.Errorf("%d idle workers after Close", got)
	}
	w := &idleWorker{ch: make(chan *serverCall, 1)}
	if ts.srv.workers.next(w); ts.srv.idleCount() != 0 || len(w.ch) != 1 || <-w.ch != nil {
		t.Errorf("next after Close kept a worker instead of telling it to exit")
	}
}

// An idle worker waits below a frame of parkedStack bytes, so that the GC
// does not halve the stack its calls grew (docs/performance.md, "Server
// workers"). The stack the GC scans therefore holds that frame for each
// idle worker. A worker parked in a shallow frame has under 1 KiB scanned.
func TestIdleWorkersKeepTheirStacks(t *testing.T) {
	const workers = 64
	var arrived sync.WaitGroup
	arrived.Add(workers)
	h := HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		// Every call holds its worker until all have one, so that as
		// many workers go idle together.
		arrived.Done()
		arrived.Wait()
		echo(ctx, req, resp)
	})
	ts := startServer(t, h, ServerConfig{noInline: true})
	p := newPool(t, Config{})
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
			if err != nil {
				errs <- err
				return
			}
			p.Release(resp)
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("RoundTrip: %v", err)
	}
	eventually(t, "every worker idle", func() bool { return ts.srv.idleCount() == workers })
	runtime.GC()
	sample := []metrics.Sample{{Name: "/gc/scan/stack:bytes"}}
	metrics.Read(sample)
	if sample[0].Value.Kind() != metrics.KindUint64 {
		t.Skip("runtime/metrics has no /gc/scan/stack:bytes")
	}
	if got, want := sample[0].Value.Uint64(), uint64(workers*parkedStack); got < want {
		t.Fatalf("the GC scanned %d bytes of stack with %d idle workers, want at least %d: "+
			"idle workers no longer wait below their stack floor (idleWorker.wait)", got, workers, want)
	}
}

// pipeline writes n requests in one write on a new connection to addr,
// with ids from 1, the one with id block asking for method "block", and
// returns the connection and a reader of its responses.
func pipeline(t *testing.T, addr string, n int, block uint64) (net.Conn, *protocol.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var frames []byte
	for id := uint64(1); id <= uint64(n); id++ {
		req := newRequest("x")
		if id <= block {
			req.Method = "block"
		}
		req.Header.SetID(id)
		frames = protocol.AppendMessage(frames, req)
	}
	if _, err := c.Write(frames); err != nil {
		t.Fatal(err)
	}
	return c, protocol.NewReader(bufio.NewReader(c), 1<<20)
}

// A request queued for a worker never waits behind a handler that blocks:
// with the first requests of a batch read together blocked in their
// handlers, the last one is answered.
func TestQueuedCallNotHeldByBlockedHandlers(t *testing.T) {
	const blocked = 16
	release := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if req.Method == "block" {
			<-release
		}
		echo(ctx, req, resp)
	})
	ts := startServer(t, h, ServerConfig{})
	defer close(release)
	c, rd := pipeline(t, ts.addr, blocked+1, blocked)
	got := make(chan uint64, 1)
	go func() {
		var resp protocol.Message
		if err := rd.Read(&resp); err != nil {
			got <- 0
			return
		}
		got <- resp.Header.ID()
	}()
	select {
	case id := <-got:
		if id != blocked+1 {
			t.Fatalf("first response has id %d, want %d (the request behind %d blocked ones)", id, blocked+1, blocked)
		}
	case <-time.After(defaultTestTimeout):
		c.Close()
		t.Fatalf("no response within %v: the request queued behind %d blocked handlers waited for them", defaultTestTimeout, blocked)
	}
}

// Requests read together are run by a few workers, each taking the next
// queued one when its call is done, not by one woken worker per request
// (docs/performance.md, "Server workers").
func TestBatchRunsOnFewWorkers(t *testing.T) {
	const batch, attempts = 256, 5
	// One P, so how many workers the batch uses depends on the hand-off
	// alone, not on how the machine schedules the threads of many Ps.
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	var used []int
	for range attempts {
		ts := startServer(t, echo, ServerConfig{})
		eventually(t, "earlier servers' workers to exit", func() bool { return workerGoroutines() == 0 })
		_, rd := pipeline(t, ts.addr, batch, 0)
		var resp protocol.Message
		for range batch {
			if err := rd.Read(&resp); err != nil {
				t.Fatal(err)
			}
		}
		// Each worker goes idle when the queue is empty, so this counts
		// the workers the batch used.
		eventually(t, "the workers idle", func() bool { return ts.srv.idleCount() == workerGoroutines() })
		n := workerGoroutines()
		_ = ts.srv.Close()
		if n <= batch/4 {
			return
		}
		// A worker preempted in a system call lets the next one in the
		// chain of hand-offs start, so a busy machine can stretch one
		// attempt. The old hand-off used a worker per request in every
		// attempt.
		used = append(used, n)
	}
	t.Fatalf("%d requests read together ran on %v workers in %d attempts, want at most %d once: each was handed to a worker of its own",
		batch, used, attempts, batch/4)
}
