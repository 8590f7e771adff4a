// Peer: who is at the other end of a server connection, as a handler's context tells it.

package transport

import (
	"context"
	"crypto/tls"
	"net"
)

// Peer is the client end of a connection a Server serves. It is made once
// per connection, after the TLS handshake if any, and never changes.
type Peer struct {
	// RemoteAddr is the client's address.
	RemoteAddr net.Addr
	// LocalAddr is the server's address the client reached.
	LocalAddr net.Addr
	// TLS is the connection's state after its handshake; nil on a
	// plaintext connection. Its VerifiedChains hold the client
	// certificate's chains, when the server's tls.Config asked for one and
	// verified it.
	TLS *tls.ConnectionState
}

// peerKey is the context key under which a server's contexts answer
// with the connection's *Peer.
type peerKey struct{}

// RemotePeer returns the peer of the connection whose request a handler's
// ctx, or a context derived from it, serves. ok is false for any other
// context. The Peer is shared by every call on the connection: read it,
// do not modify it. RemotePeer allocates nothing.
func RemotePeer(ctx context.Context) (p *Peer, ok bool) {
	p, ok = ctx.Value(peerKey{}).(*Peer)
	return p, ok && p != nil
}

// ContextWithPeer returns a copy of parent that RemotePeer answers with p.
// A Server's handlers get such contexts without it. It is for tests, and
// for code that runs a Handler outside a Server.
func ContextWithPeer(parent context.Context, p *Peer) context.Context {
	return context.WithValue(parent, peerKey{}, p)
}

// peerCtx is the context of a call that needs no handlerCtx: a one-way
// request without a budget. It is the server's base context, answering
// with the connection's peer. Each connection holds one, so such calls
// allocate no context of their own.
type peerCtx struct {
	context.Context
	peer *Peer
}

// Value answers peerKey with the connection's peer, and any other key as
// the base context does.
func (c *peerCtx) Value(key any) any {
	if _, ok := key.(peerKey); ok {
		return c.peer
	}
	return c.Context.Value(key)
}
