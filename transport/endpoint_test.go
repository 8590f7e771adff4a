package transport

import (
	"errors"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func TestDialFailureAndBackoff(t *testing.T) {
	l := listen(t)
	addr := l.Addr().String()
	_ = l.Close() // nothing listens there now
	var d countingDial
	p := newPool(t, Config{Dial: d.dial})

	_, err := p.RoundTrip(testCtx(t), addr, newRequest("x"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	if !errors.Is(err, protocol.ErrUnavailable) {
		t.Errorf("errors.Is(err, protocol.ErrUnavailable) = false for %v", err)
	}
	if d.n.Load() != 1 {
		t.Fatalf("%d dials, want 1", d.n.Load())
	}
	if !p.BackingOff(addr) {
		t.Error("BackingOff = false right after a failed dial; want true")
	}
	// In backoff: fail fast without dialing.
	start := time.Now()
	_, err = p.RoundTrip(testCtx(t), addr, newRequest("x"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	if got := d.n.Load(); got != 1 {
		t.Fatalf("%d dials during backoff, want still 1", got)
	}
	if time.Since(start) > time.Second {
		t.Errorf("a call in backoff took %v; it should fail fast", time.Since(start))
	}

	// Once the backoff delay has passed, the next call dials again; the
	// delay doubles after each failure.
	deadline := time.Now().Add(defaultTestTimeout)
	for d.n.Load() < 2 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // waiting out the backoff is what is tested
		_, _ = p.RoundTrip(testCtx(t), addr, newRequest("x"))
	}
	if time.Since(start) < backoffMin-10*time.Millisecond {
		t.Errorf("redialed after %v, before the %v backoff", time.Since(start), backoffMin)
	}
	if got := d.n.Load(); got != 2 {
		t.Fatalf("%d dials after the backoff, want 2", got)
	}

	// The address comes back: a successful dial resets the backoff.
	serveAgain(t, p, addr, 20*time.Millisecond) // waiting out the backoff
	if p.BackingOff(addr) {
		t.Error("BackingOff = true after a successful dial; want false")
	}
}

// TestBackingOffWithOpenConnection: a failed dial does not put an address
// in backoff while a connection to it is open, which calls take meanwhile
// (a server at MaxConns refused one more, say).
func TestBackingOffWithOpenConnection(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 2})
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
	if err != nil {
		t.Fatal(err)
	}
	p.Release(resp)
	e, err := p.endpoint(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	e.refused(errors.New("refused at MaxConns"))
	if p.BackingOff(ts.addr) {
		t.Error("BackingOff = true with a connection open; want false")
	}
	e.mu.Lock()
	e.failedLocked(errors.New("connection refused"))
	e.mu.Unlock()
	for i := range e.slots {
		if c := e.slots[i].Load(); c != nil {
			c.retire()
		}
	}
	if !p.BackingOff(ts.addr) {
		t.Error("BackingOff = false with every connection retired after a failed dial; want true")
	}
}

func TestSharedFirstDial(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	var d countingDial
	p := newPool(t, Config{ConnsPerAddr: 1, Dial: d.dial})
	const callers = 32
	var wg sync.WaitGroup
	start := make(chan struct{})
	errs := make(chan error, callers)
	for range callers {
		wg.Go(func() {
			<-start
			resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("first"))
			if err != nil {
				errs <- err
				return
			}
			p.Release(resp)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("RoundTrip: %v", err)
	}
	if got := d.n.Load(); got != 1 {
		t.Errorf("%d dials for %d concurrent first calls, want 1", got, callers)
	}
}

// serveAgain starts a server on addr, whose old one went away, and makes
// calls through p, pace apart, until one succeeds; they may fail only as
// not sent meanwhile.
func serveAgain(t *testing.T, p *Pool, addr string, pace time.Duration) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	startServerOn(t, l, echo, ServerConfig{})
	deadline := time.Now().Add(defaultTestTimeout)
	for {
		resp, err := p.RoundTrip(testCtx(t), addr, newRequest("again"))
		if err == nil {
			p.Release(resp)
			return
		}
		if !errors.Is(err, ErrNotSent) || time.Now().After(deadline) {
			t.Fatalf("RoundTrip once %s is back: %v", addr, err)
		}
		time.Sleep(pace)
	}
}

// TestDialBackoffCap (#17): however many dials failed in a row, the next
// one is at most a second away, so an instance that comes back after a
// long outage without leaving the instance list is called within a
// second of its return. The delay doubles from 50 ms up to that cap.
func TestDialBackoffCap(t *testing.T) {
	p := newPool(t, Config{})
	e, err := p.endpoint("127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	prev := time.Duration(0)
	for i := range 30 {
		e.mu.Lock()
		e.failedLocked(errors.New("connection refused"))
		delay := time.Until(e.retryAt)
		e.mu.Unlock()
		if delay > time.Second {
			t.Fatalf("after %d failed dials the next is %v away, want at most 1s", i+1, delay)
		}
		if i < 4 && delay < prev {
			t.Fatalf("after %d failed dials the delay fell from %v to %v, want it doubling", i+1, prev, delay)
		}
		prev = delay
	}
	if prev < 900*time.Millisecond {
		t.Errorf("after 30 failed dials the delay is %v, want the 1s cap", prev)
	}
}

// TestReadOnlyAddressIsNotDialedForCalls: a call to a read-only address
// with no connection left is refused as not sent, and dials nothing: only
// the probe dials there, and a heartbeat goes first. A call's own dial
// could land in a draining server's accept queue after its last Accept
// and be reset with the call on it.
func TestReadOnlyAddressIsNotDialedForCalls(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	var d countingDial
	p := newPool(t, Config{Dial: d.dial})
	e, err := p.endpoint(ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	e.markReadOnly() // as if the read-only event came on a connection since closed
	_, err = p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
	wantStatus(t, err, protocol.StatusChannelInactive, false, true)
	if got := d.n.Load(); got != 0 {
		t.Errorf("%d dials for a call to a read-only address; want none", got)
	}
}
