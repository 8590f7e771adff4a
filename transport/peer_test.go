package transport

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

type otherKey struct{}

func TestRemotePeer(t *testing.T) {
	p := &Peer{RemoteAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 1}}
	tests := []struct {
		name string
		ctx  context.Context
		want *Peer
	}{
		{"background", context.Background(), nil},
		{"ContextWithPeer", ContextWithPeer(context.Background(), p), p},
		{"nil peer", ContextWithPeer(context.Background(), nil), nil},
		{"handler context", newHandlerCtx(context.Background(), time.Time{}, &protocol.Message{}, p), p},
		{"derived from a handler context", context.WithValue(newHandlerCtx(context.Background(), time.Time{}, &protocol.Message{}, p), otherKey{}, 1), p},
		{"handler context without a peer", newHandlerCtx(context.Background(), time.Time{}, &protocol.Message{}, nil), nil},
		{"connection context", &peerCtx{Context: context.Background(), peer: p}, p},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := RemotePeer(tt.ctx)
			if got != tt.want || ok != (tt.want != nil) {
				t.Fatalf("RemotePeer = %p, %v; want %p, %v", got, ok, tt.want, tt.want != nil)
			}
		})
	}
}

// TestRemotePeerAllocs: asking a handler's context for its peer allocates
// nothing, and a plaintext call whose handler asks costs the server no
// more than the handler context's own allocation (TestHandlerCtxAllocs).
func TestRemotePeerAllocs(t *testing.T) {
	base, cancel := context.WithCancel(context.Background())
	defer cancel()
	hc := newHandlerCtx(base, time.Time{}, &protocol.Message{}, &Peer{})
	pc := &peerCtx{Context: base, peer: &Peer{}}
	if n := testing.AllocsPerRun(1000, func() {
		if _, ok := RemotePeer(hc); !ok {
			t.Fatal("no peer in a handler context")
		}
		if _, ok := RemotePeer(pc); !ok {
			t.Fatal("no peer in a connection context")
		}
	}); n != 0 {
		t.Errorf("RemotePeer allocates %v times per call, want 0", n)
	}

	peer, msg := &Peer{}, &protocol.Message{}
	perCall := testing.AllocsPerRun(1000, func() {
		c := newHandlerCtx(base, time.Time{}, msg, peer)
		c.cancel(context.Canceled)
	})
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if p, ok := RemotePeer(ctx); !ok || p.RemoteAddr == nil || p.TLS != nil {
			resp.Header.SetStatus(protocol.StatusServiceError)
			return
		}
		resp.Payload = append(resp.Payload[:0], req.Payload...)
	}), ServerConfig{})
	c := dialRaw(t, ts.addr)
	rd := protocol.NewReader(bufioReader(c), protocol.DefaultMaxBody)
	req := &protocol.Message{Service: "test.Echo", Method: "Echo", Payload: make([]byte, 64)}
	req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22))
	roundTrip, resp := rawRoundTrip(t, c, rd, req)
	call := func() {
		roundTrip()
		if s := resp.Header.Status(); s != protocol.StatusOK {
			t.Fatalf("status %v: the handler found no plaintext peer", s)
		}
	}
	for range 100 { // warm the pools and the workers
		call()
	}
	if got := testing.AllocsPerRun(1000, call); got > perCall {
		t.Errorf("serving a plaintext call whose handler asks RemotePeer allocates %v, want at most %v, "+
			"the handler context's own: the peer must stay a per-connection value", got, perCall)
	}
}
