package dabb_test

import (
	"context"
	"testing"

	"github.com/dabbrpc/dabb"
)

// TestRemotePeer: a handler learns the addresses of a plaintext call, and
// that it has no TLS; a context that is no handler's has no peer. The
// mTLS case is in TestMTLSThroughEtcd.
func TestRemotePeer(t *testing.T) {
	if _, ok := dabb.RemotePeer(context.Background()); ok {
		t.Fatal("RemotePeer found a peer in context.Background()")
	}
	p := newProbe()
	seen := make(chan dabb.Peer, 1)
	p.record = func(ctx context.Context) {
		peer, ok := dabb.RemotePeer(ctx)
		if !ok {
			t.Error("RemotePeer found no peer in a handler's context")
		}
		select {
		case seen <- peer:
		default:
		}
	}
	_, addr := startServer(t, p)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := call(ctx, c, "echo"); err != nil {
		t.Fatal(err)
	}
	peer := <-seen
	if peer.LocalAddr == nil || peer.LocalAddr.String() != addr {
		t.Errorf("LocalAddr = %v, want the server's %s", peer.LocalAddr, addr)
	}
	if peer.RemoteAddr == nil || peer.RemoteAddr.String() == addr {
		t.Errorf("RemoteAddr = %v, want the client's address", peer.RemoteAddr)
	}
	if peer.TLS != nil {
		t.Errorf("TLS = %v on a plaintext call, want nil", peer.TLS)
	}
}
