package dabb_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

// handshakeState runs a real TLS handshake over loopback TCP, the client
// presenting cert (none if nil) to a server with clientAuth, and returns
// the server's view of the connection.
func handshakeState(t *testing.T, ca *tlstest.CA, clientAuth tls.ClientAuthType, cert *tls.Certificate) *tls.ConnectionState {
	t.Helper()
	serverCert := ca.Issue(t, tlstest.Spec{CommonName: "server", IPs: tlstest.Loopback})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	type result struct {
		state tls.ConnectionState
		err   error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := l.Accept()
		if err != nil {
			done <- result{err: err}
			return
		}
		defer nc.Close()
		tc := tls.Server(nc, &tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(), ClientAuth: clientAuth})
		err = tc.Handshake()
		done <- result{tc.ConnectionState(), err}
	}()
	cfg := &tls.Config{RootCAs: ca.Pool()}
	if cert != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return cert, nil }
	}
	nc, err := tls.Dial("tcp", l.Addr().String(), cfg)
	if err != nil {
		t.Fatalf("handshake: %v", err)
	}
	defer nc.Close()
	r := <-done
	if r.err != nil {
		t.Fatalf("server handshake: %v", r.err)
	}
	return &r.state
}

func TestRequirePeerIdentity(t *testing.T) {
	ca, other := tlstest.NewCA(t, "dabb test CA"), tlstest.NewCA(t, "another CA")
	payments := ca.Issue(t, tlstest.Spec{CommonName: "payments", Organization: "Example", Client: true,
		DNSNames: []string{"Payments.Internal"}, URIs: []string{"spiffe://example.org/payments"}})
	ledger := ca.Issue(t, tlstest.Spec{CommonName: "ledger", Organization: "Example", Client: true,
		DNSNames: []string{"ledger.internal"}, URIs: []string{"spiffe://example.org/ledger"}})
	verified := func(c tls.Certificate) *tls.ConnectionState {
		return handshakeState(t, ca, tls.RequireAndVerifyClientCert, &c)
	}
	tcp := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4242}
	withPeer := func(st *tls.ConnectionState) context.Context {
		return transport.ContextWithPeer(context.Background(), &transport.Peer{RemoteAddr: tcp, LocalAddr: tcp, TLS: st})
	}
	otherCA := other.Issue(t, tlstest.Spec{CommonName: "payments", Organization: "Example", Client: true,
		DNSNames: []string{"payments.internal"}})

	tests := []struct {
		name  string
		allow dabb.Identities
		ctx   context.Context
		code  string // "" admits
	}{
		{"DNS name, any case", dabb.Identities{DNSNames: []string{"payments.internal"}}, withPeer(verified(payments)), ""},
		{"URI", dabb.Identities{URIs: []string{"spiffe://example.org/payments"}}, withPeer(verified(payments)), ""},
		{"subject", dabb.Identities{Subjects: []string{"CN=payments,O=Example"}}, withPeer(verified(payments)), ""},
		{"one of several", dabb.Identities{DNSNames: []string{"x.internal"}, URIs: []string{"spiffe://example.org/payments"}},
			withPeer(verified(payments)), ""},
		{"another identity", dabb.Identities{DNSNames: []string{"payments.internal"}, URIs: []string{"spiffe://example.org/payments"},
			Subjects: []string{"CN=payments,O=Example"}}, withPeer(verified(ledger)), protocol.CodePermissionDenied},
		{"empty lists", dabb.Identities{}, withPeer(verified(payments)), protocol.CodePermissionDenied},
		{"plaintext", dabb.Identities{DNSNames: []string{"payments.internal"}}, withPeer(nil), protocol.CodeUnauthenticated},
		{"no peer", dabb.Identities{DNSNames: []string{"payments.internal"}}, context.Background(), protocol.CodeUnauthenticated},
		// A certificate the server did not verify is never looked at,
		// even when it names an allowed identity.
		{"unverified certificate", dabb.Identities{DNSNames: []string{"payments.internal"}},
			withPeer(handshakeState(t, ca, tls.RequireAnyClientCert, &otherCA)), protocol.CodeUnauthenticated},
		{"no certificate", dabb.Identities{DNSNames: []string{"payments.internal"}},
			withPeer(handshakeState(t, ca, tls.VerifyClientCertIfGiven, nil)), protocol.CodeUnauthenticated},
	}
	info := &dabb.CallInfo{Service: "pay.Payments", Method: "Charge"}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ran := 0
			reply, err := dabb.RequirePeerIdentity(tt.allow)(tt.ctx, info, func(context.Context) (any, error) {
				ran++
				return "charged", nil
			})
			if tt.code == "" {
				if err != nil || reply != "charged" || ran != 1 {
					t.Fatalf("= %v, %v after %d handler runs; want the handler's reply", reply, err, ran)
				}
				return
			}
			if ran != 0 {
				t.Fatalf("the handler ran %d times for a rejected call", ran)
			}
			var pe *protocol.Error
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v (%T), want a *protocol.Error", err, err)
			}
			if pe.Status != protocol.StatusBadRequest || pe.Code != tt.code {
				t.Fatalf("err = status %v code %q, want status 40 code %q (%v)", pe.Status, pe.Code, tt.code, err)
			}
			if !strings.Contains(pe.Msg, "pay.Payments.Charge") {
				t.Errorf("message %q does not name the method", pe.Msg)
			}
		})
	}
}
