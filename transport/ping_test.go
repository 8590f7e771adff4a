package transport

import (
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// TestPing: a heartbeat round trip on every connection of an address. A
// server answers it, with no handler run, over the connections calls use.
// A peer that reads nothing (a frozen process: the kernel accepts for it)
// fails it when the context ends, leaving nothing pending, and the
// connection keeps its calls. A closed pool fails it at once.
func TestPing(t *testing.T) {
	handled := make(chan struct{}, 1)
	ts := startServer(t, HandlerFunc(func(context.Context, *protocol.Message, *protocol.Message) {
		handled <- struct{}{}
	}), ServerConfig{})
	p := newPool(t, Config{})
	// Before any call: Ping dials.
	if err := p.Ping(testCtx(t), ts.addr); err != nil {
		t.Fatalf("Ping before any call: %v", err)
	}
	for range 4 { // open both small-call connections
		resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("x"))
		if err != nil {
			t.Fatal(err)
		}
		p.Release(resp)
		<-handled
	}
	if err := p.Ping(testCtx(t), ts.addr); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	select {
	case <-handled:
		t.Fatal("a Ping ran the handler")
	default:
	}

	// A listener whose connections nobody reads: the kernel completes
	// the handshake, and the heartbeat sits in its buffer.
	l := listen(t)
	held := make(chan net.Conn, 4)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Cleanup(func() {
		l.Close()
		for {
			select {
			case c := <-held:
				c.Close()
			default:
				return
			}
		}
	})
	ctx, cancel := context.WithTimeout(testCtx(t), 50*time.Millisecond)
	defer cancel()
	err := p.Ping(ctx, l.Addr().String())
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Ping of a peer that reads nothing = %v, want the context's deadline", err)
	}
	if n := p.pendingLen(l.Addr().String()); n != 0 {
		t.Fatalf("%d entries pending after the Ping gave up, want 0", n)
	}

	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Ping(testCtx(t), ts.addr); !errors.Is(err, ErrClosed) {
		t.Fatalf("Ping on a closed pool = %v, want ErrClosed", err)
	}
}
