// RemotePeer: who called, as a handler or interceptor sees it.

package dabb

import (
	"context"
	"crypto/tls"
	"net"

	"github.com/dabbrpc/dabb/transport"
)

// Peer is the client of a call: its address and, over TLS, the state of
// its connection.
type Peer struct {
	// RemoteAddr is the client's address.
	RemoteAddr net.Addr
	// LocalAddr is the server's address the client reached.
	LocalAddr net.Addr
	// TLS is the connection's state after its handshake; nil on a
	// plaintext connection. With mTLS (see WithTLS),
	// TLS.VerifiedChains[0][0] is the client's verified certificate. Do
	// not trust TLS.PeerCertificates alone: they may be unverified.
	TLS *tls.ConnectionState
}

// RemotePeer returns the client of the call a handler's or interceptor's
// ctx serves, or of a context derived from it. ok is false for any other
// context. The TLS state is shared by the connection's calls: read it, do
// not modify it.
func RemotePeer(ctx context.Context) (p Peer, ok bool) {
	tp, ok := transport.RemotePeer(ctx)
	if !ok {
		return Peer{}, false
	}
	return Peer{RemoteAddr: tp.RemoteAddr, LocalAddr: tp.LocalAddr, TLS: tp.TLS}, true
}
