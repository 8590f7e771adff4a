// End-to-end tests of a TLS connection's life past the handshake: its
// heartbeats and the read-only event of a graceful shutdown.

package dabb_test

import (
	"context"
	"crypto/tls"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

// TestTLSConnectionOutlivesIdleHeartbeats: an idle mTLS connection lives
// on its heartbeats. The server closes a connection silent for three
// intervals; after eight, the next call still comes over the same
// connection, from the same client port.
func TestTLSConnectionOutlivesIdleHeartbeats(t *testing.T) {
	ca := tlstest.NewCA(t, "dabb test CA")
	serverCert := ca.Issue(t, tlstest.Spec{CommonName: "server", IPs: tlstest.Loopback})
	clientCert := ca.Issue(t, tlstest.Spec{CommonName: "client", Client: true})
	const interval = 50 * time.Millisecond
	p := newProbe()
	ports := make(chan string, 2)
	p.record = func(ctx context.Context) {
		peer, _ := dabb.RemotePeer(ctx)
		if peer.TLS == nil {
			t.Error("a call came over plaintext")
		}
		ports <- peer.RemoteAddr.String()
	}
	_, addr := startServer(t, p, dabb.WithTransport(transport.ServerConfig{HeartbeatInterval: interval}),
		dabb.WithTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(),
			ClientAuth: tls.RequireAndVerifyClientCert}))
	c := newClientWith(t, []proxy.Option{
		proxy.WithTransport(transport.Config{HeartbeatInterval: interval, ConnsPerAddr: 1}),
		proxy.WithTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: []tls.Certificate{clientCert}}),
	}, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := call(ctx, c, "echo"); err != nil {
		t.Fatal(err)
	}
	time.Sleep(8 * interval) // the idle time under test, not a synchronisation
	if _, err := call(ctx, c, "echo"); err != nil {
		t.Fatalf("call after %v idle: %v", 8*interval, err)
	}
	if first, second := <-ports, <-ports; first != second {
		t.Fatalf("the calls came from %s, then %s: the idle TLS connection was closed", first, second)
	}
}

// TestTLSShutdownSendsReadOnly: a TLS server's graceful shutdown tells
// its connected clients with the read-only event, as in plaintext.
func TestTLSShutdownSendsReadOnly(t *testing.T) {
	ca := tlstest.NewCA(t, "dabb test CA")
	serverCert := ca.Issue(t, tlstest.Spec{CommonName: "server", IPs: tlstest.Loopback})
	s, addr := startServer(t, newProbe(), dabb.WithTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}}))
	readOnly := make(chan string, 1)
	var once sync.Once
	pool := transport.NewPool(transport.Config{TLS: &tls.Config{RootCAs: ca.Pool()}, Logger: quiet,
		OnReadOnly: func(a string) { once.Do(func() { readOnly <- a }) }})
	defer pool.Close()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	// A call to no service opens the connection and runs no handler.
	m := &protocol.Message{Service: "test.None", Method: "Do", Timeout: time.Second}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 0)
	resp, err := pool.RoundTrip(ctx, addr, m)
	if err == nil {
		pool.Release(resp)
		t.Fatal("a call to no service succeeded")
	}
	if pe := statusOf(t, err); !pe.Remote || pe.Status != protocol.StatusServiceNotFound {
		t.Fatalf("the TLS call to no service got %v, want the server's 60", err)
	}
	if err := s.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	select {
	case a := <-readOnly:
		if a != addr {
			t.Errorf("read-only event from %s, want %s", a, addr)
		}
	case <-ctx.Done():
		t.Fatal("the TLS client got no read-only event from a server shutting down")
	}
}
