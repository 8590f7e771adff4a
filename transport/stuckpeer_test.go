package transport

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// readRequests reads frames from c until it has seen n requests, skipping
// events, and checks that each request's payload is want: a frame whose
// write was cut off by its caller's time must still arrive whole.
func readRequests(t *testing.T, c net.Conn, n int, want []byte) {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	r := protocol.NewReader(bufio.NewReader(c), 64<<20)
	for got := 0; got < n; {
		var m protocol.Message
		if err := r.Read(&m); err != nil {
			t.Fatalf("after %d of %d requests: %v", got, n, err)
		}
		if m.Header.Flags().IsEvent() {
			continue
		}
		if !bytes.Equal(m.Payload, want) {
			t.Fatalf("request %d arrived with a payload of %d bytes, want %d intact ones", got, len(m.Payload), len(want))
		}
		got++
	}
}

// TestSmallCallsEndWhenThePeerStopsReading: calls to a peer that stopped
// reading end at their deadline, also the one whose goroutine was writing
// the connection's frames when the socket's buffer filled (it used to
// wait there until the stall detection closed the connection, minutes
// later); the frames still arrive whole once the peer reads again.
func TestSmallCallsEndWhenThePeerStopsReading(t *testing.T) {
	addr, conns := rawServer(t)
	p := newPool(t, Config{ConnsPerAddr: 1})
	payload := bytes.Repeat([]byte{'s'}, 40<<10) // small, but 200 of them overflow the socket buffers
	const calls, budget = 200, 200 * time.Millisecond
	errs := make(chan error, calls)
	start := time.Now()
	for range calls {
		go func() {
			req := newRequest(string(payload))
			req.Timeout = budget
			_, err := p.RoundTrip(context.Background(), addr, req)
			errs <- err
		}()
	}
	for i := range calls {
		select {
		case err := <-errs:
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Status != protocol.StatusServerTimeout || pe.Remote || errors.Is(err, ErrNotSent) {
				t.Fatalf("call to a peer that reads nothing = %v, want a local 31 (sent, timed out)", err)
			}
		case <-time.After(budget + 2*time.Second): // a bound on each call's time, not a synchronization
			t.Fatalf("%d of %d calls with a %v budget still blocked after %v", calls-i, calls, budget, time.Since(start))
		}
	}
	readRequests(t, waitFor(t, conns, "the connection"), calls, payload)
}

// TestLargeCallEndsWhenThePeerStopsReading: a large request's write to a
// peer that stopped reading ends at the call's deadline (31, it may have
// been acted on: part of it left), and a second large call waiting for
// its turn behind it ends with its context (90, never sent). The first
// frame is finished in the background and arrives whole.
func TestLargeCallEndsWhenThePeerStopsReading(t *testing.T) {
	addr, conns := rawServer(t)
	// More than the socket buffers of both sides hold (a few MiB on
	// loopback), so the first frame cannot be finished while the peer
	// reads nothing.
	p := newPool(t, Config{ConnsPerAddr: 1, MaxBody: 64 << 20})
	payload := bytes.Repeat([]byte{'L'}, 32<<20)
	const budget = 200 * time.Millisecond

	req := newRequest(string(payload))
	req.Timeout = budget
	start := time.Now()
	_, err := p.RoundTrip(context.Background(), addr, req)
	if el := time.Since(start); el > budget+time.Second {
		t.Fatalf("a large call with a %v budget returned after %v", budget, el)
	}
	wantStatus(t, err, protocol.StatusServerTimeout, false, false)

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(100*time.Millisecond, cancel)
	_, err = p.RoundTrip(ctx, addr, newRequest(string(payload)))
	pe := wantStatus(t, err, protocol.StatusClientError, false, true)
	if !errors.Is(pe, protocol.ErrCanceled) {
		t.Fatalf("cancelled while waiting for its turn: %v, want ErrCanceled", err)
	}

	// No small call went first: the connection for large requests is
	// the only one (while it dials, a large request takes any other).
	readRequests(t, waitFor(t, conns, "the large requests' connection"), 1, payload)
}
