package dabb_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

// reasons counts what a server reports to its observer.
type reasons struct {
	mu     sync.Mutex
	counts map[transport.Rejection]int
	open   int // open now
	opened int // ever
}

func (r *reasons) Rejected(reason transport.Rejection) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.counts[reason]++
}

func (r *reasons) ConnOpened() { r.mu.Lock(); r.open++; r.opened++; r.mu.Unlock() }
func (r *reasons) ConnClosed() { r.mu.Lock(); r.open--; r.mu.Unlock() }

func (r *reasons) get(reason transport.Rejection) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.counts[reason]
}

func (r *reasons) conns() (open, opened int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.open, r.opened
}

// TestWithObserver: the server reports the calls it refuses before the
// interceptors, an unknown service or method and a serialization it did
// not import, and the transport its connections. A WithTransport given
// after WithObserver keeps the observer.
func TestWithObserver(t *testing.T) {
	obs := &reasons{counts: map[transport.Rejection]int{}}
	p := newProbe()
	_, addr := startServer(t, p, dabb.WithObserver(obs), dabb.WithTransport(transport.ServerConfig{MaxConcurrent: 8}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, tc := range []struct {
		service, method string
		ser             byte
		want            protocol.Status
	}{
		{probeDesc.Name, "Nope", 22, protocol.StatusServiceNotFound},
		{"test.Nope", "Do", 22, protocol.StatusServiceNotFound},
		// Dubbo's java serialization: answered 40 in the peer's words,
		// which a dabb client reads as a peer that is not a dabb server.
		{probeDesc.Name, "Do", 3, protocol.StatusBadResponse},
	} {
		err := rawCall(ctx, t, addr, tc.service, tc.method, tc.ser, nil)
		if got := protocol.StatusOf(err); got != tc.want {
			t.Errorf("%s.%s (serialization %d): status %v, want %v", tc.service, tc.method, tc.ser, got, tc.want)
		}
	}
	if n := obs.get(transport.RejectUnimplemented); n != 2 {
		t.Errorf("%d unimplemented reported, want 2", n)
	}
	if n := obs.get(transport.RejectBadRequest); n != 1 {
		t.Errorf("%d bad requests reported, want 1", n)
	}
	if p.ran.Load() != 0 {
		t.Errorf("the handler ran %d times", p.ran.Load())
	}
	// rawCall closes its pool: every connection it opened is closed.
	if _, opened := obs.conns(); opened != 3 {
		t.Errorf("%d connections reported opened, want 3: one per rawCall", opened)
	}
	wait.Until(t, testTimeout, time.Millisecond, "the server to report its connections closed", func() bool {
		open, _ := obs.conns()
		return open == 0
	})
}
