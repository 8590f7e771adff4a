package dabb_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
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

// TestRequirePeerIdentityOverMTLS: over real mTLS handshakes, a client
// whose certificate names the allowed SAN calls. Another client of the
// same CA is refused with ErrPermissionDenied before the handler runs.
// The refusal is one attempt, though the method is called idempotent,
// retries are on and a second instance could take a retry.
func TestRequirePeerIdentityOverMTLS(t *testing.T) {
	ca := tlstest.NewCA(t, "dabb test CA")
	serverCert := ca.Issue(t, tlstest.Spec{CommonName: "server", IPs: tlstest.Loopback})
	payments := ca.Issue(t, tlstest.Spec{CommonName: "payments", Client: true, DNSNames: []string{"payments.internal"}})
	ledger := ca.Issue(t, tlstest.Spec{CommonName: "ledger", Client: true, DNSNames: []string{"ledger.internal"}})

	// served counts, outside the identity check, every call a server
	// sees: the attempts that reached it.
	var served atomic.Int64
	count := func(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
		served.Add(1)
		return next(ctx)
	}
	p := newProbe()
	var addrs []string
	for _, auth := range []tls.ClientAuthType{tls.RequireAndVerifyClientCert, tls.VerifyClientCertIfGiven} {
		_, addr := startServer(t, p,
			dabb.WithTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(), ClientAuth: auth}),
			dabb.WithInterceptor(count, dabb.RequirePeerIdentity(dabb.Identities{DNSNames: []string{"payments.internal"}})))
		addrs = append(addrs, addr)
	}
	client := func(t *testing.T, obs proxy.Observer, addrs []string, certs ...tls.Certificate) *proxy.Client {
		return newClientWith(t, []proxy.Option{proxy.WithObserver(obs), proxy.WithBalancer("round_robin"),
			proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 3}),
			proxy.WithTLS(&tls.Config{RootCAs: ca.Pool(), Certificates: certs})}, addrs...)
	}
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	t.Run("allowed SAN", func(t *testing.T) {
		served.Store(0)
		p.ran.Store(0)
		c := client(t, &attempts{}, addrs, payments)
		for range 2 { // round robin: one call to each server
			if _, err := call(ctx, c, "echo", proxy.Idempotent()); err != nil {
				t.Fatalf("payments.internal: %v, want admitted", err)
			}
		}
		if n, s := p.ran.Load(), served.Load(); n != 2 || s != 2 {
			t.Errorf("the handler ran %d times, the servers saw %d calls; want 2 and 2", n, s)
		}
	})
	t.Run("another SAN of the same CA", func(t *testing.T) {
		served.Store(0)
		p.ran.Store(0)
		obs := &attempts{}
		c := client(t, obs, addrs, ledger)
		for i := range 2 {
			_, err := call(ctx, c, "echo", proxy.Idempotent())
			if !errors.Is(err, proxy.ErrPermissionDenied) || errors.Is(err, proxy.ErrUnauthenticated) ||
				errors.Is(err, proxy.ErrBadRequest) {
				t.Fatalf("call %d: %v, want one matching proxy.ErrPermissionDenied alone", i, err)
			}
			if pe := statusOf(t, err); !pe.Remote || pe.Status != protocol.StatusBadRequest ||
				!strings.Contains(pe.Msg, "CN=ledger may not call test.Probe.Do") {
				t.Fatalf("call %d: %#v, want the server's status 40 naming the certificate and the method", i, pe)
			}
		}
		if n := p.ran.Load(); n != 0 {
			t.Errorf("the handler ran %d times for refused calls, want 0", n)
		}
		if s, a, r := served.Load(), obs.attempted.Load(), obs.retried.Load(); s != 2 || a != 2 || r != 0 {
			t.Errorf("2 refused calls: the servers saw %d attempts, the client made %d and retried %d; want 2, 2, 0", s, a, r)
		}
		for _, addr := range addrs {
			if st := c.BreakerState(addr); st != "closed" {
				t.Errorf("the breaker of %s is %s after refusals, want closed", addr, st)
			}
		}
	})
	// A server that verifies a certificate only if given admits a TLS
	// client without one to the handshake; the check refuses it.
	t.Run("no client certificate", func(t *testing.T) {
		served.Store(0)
		p.ran.Store(0)
		obs := &attempts{}
		c := client(t, obs, addrs[1:])
		_, err := call(ctx, c, "echo", proxy.Idempotent())
		if !errors.Is(err, proxy.ErrUnauthenticated) || !strings.Contains(err.Error(), "requires a verified client certificate") {
			t.Fatalf("%v, want one matching proxy.ErrUnauthenticated that asks for a client certificate", err)
		}
		if n, s, a := p.ran.Load(), served.Load(), obs.attempted.Load(); n != 0 || s != 1 || a != 1 {
			t.Errorf("the handler ran %d times over %d attempts served (%d made); want 0 over 1 (1)", n, s, a)
		}
	})
}

// TestRequirePeerIdentitySkipsHealth: a TLS client without a certificate
// checks the health of a server that verifies certificates only if given,
// past RequirePeerIdentity, while its calls are refused. A server that
// requires a certificate still refuses that client at the handshake.
func TestRequirePeerIdentitySkipsHealth(t *testing.T) {
	ca := tlstest.NewCA(t, "dabb test CA")
	serverCert := ca.Issue(t, tlstest.Spec{CommonName: "server", IPs: tlstest.Loopback})
	allow := dabb.RequirePeerIdentity(dabb.Identities{DNSNames: []string{"payments.internal"}})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	for _, tc := range []struct {
		auth       tls.ClientAuthType
		healthWant string // "" for serving, else in the error
	}{
		{tls.VerifyClientCertIfGiven, ""},
		{tls.RequireAndVerifyClientCert, "requires a client certificate"},
	} {
		t.Run(tc.auth.String(), func(t *testing.T) {
			_, addr := startServer(t, newProbe(), dabb.WithInterceptor(allow),
				dabb.WithTLS(&tls.Config{Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(), ClientAuth: tc.auth}))
			c := newClientWith(t, []proxy.Option{proxy.WithCodec("json"), proxy.WithTLS(&tls.Config{RootCAs: ca.Pool()})}, addr)
			var reply health.CheckReply
			err := c.Invoke(ctx, health.ServiceName, health.MethodCheck, &health.CheckRequest{}, &reply, proxy.Via(probeDesc.Name))
			switch {
			case tc.healthWant == "" && (err != nil || reply.Status != health.Serving):
				t.Errorf("Check without a client certificate = %q, %v; want serving", reply.Status, err)
			case tc.healthWant != "" && (err == nil || !strings.Contains(err.Error(), tc.healthWant)):
				t.Errorf("Check without a client certificate = %q, %v; want the handshake's refusal", reply.Status, err)
			}
			if tc.healthWant != "" {
				return
			}
			pc := newClientWith(t, []proxy.Option{proxy.WithTLS(&tls.Config{RootCAs: ca.Pool()})}, addr)
			if _, err := call(ctx, pc, "echo"); !errors.Is(err, proxy.ErrUnauthenticated) {
				t.Errorf("a call without a client certificate = %v, want ErrUnauthenticated", err)
			}
		})
	}
}
