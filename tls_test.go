// End-to-end tests of TLS and mTLS: real handshakes with certificates
// made here, servers found through a real etcd registry.

package dabb_test

import (
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

// forceCert makes cfg present cert whatever authorities the server asks
// for; given in Certificates, a certificate of another authority is not
// sent at all.
func forceCert(cfg *tls.Config, cert tls.Certificate) *tls.Config {
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return cfg
}

// TestMTLSThroughEtcd: an mTLS server and a plaintext one, published to a
// real etcd. A client with the right certificate calls, and the handler
// sees its subject. Every other client fails not sent, within the dial
// timeout, naming TLS and the cause.
func TestMTLSThroughEtcd(t *testing.T) {
	ca, other := tlstest.NewCA(t, "dabb test CA"), tlstest.NewCA(t, "another CA")
	serverCert := ca.Issue(t, tlstest.Spec{CommonName: "server", DNSNames: []string{"dabb.test"}, IPs: tlstest.Loopback})
	clientCert := ca.Issue(t, tlstest.Spec{CommonName: "client", Organization: "dabb", Client: true})
	intruder := other.Issue(t, tlstest.Spec{CommonName: "intruder", Client: true})

	etcd := "etcd://" + etcdtest.Start(t).Endpoint()
	tlsURL, plainURL := etcd+"/tls?ttl=2s", etcd+"/plain?ttl=2s"
	p := newProbe()
	var subject atomic.Value
	p.record = func(ctx context.Context) {
		if peer, ok := dabb.RemotePeer(ctx); ok && peer.TLS != nil && len(peer.TLS.VerifiedChains) > 0 {
			subject.Store(peer.TLS.VerifiedChains[0][0].Subject.String())
		}
	}
	startServer(t, p, dabb.WithRegistry(openRegistry(t, tlsURL)), dabb.WithTLS(&tls.Config{
		Certificates: []tls.Certificate{serverCert}, ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert,
	}))
	startServer(t, newProbe(), dabb.WithRegistry(openRegistry(t, plainURL)))

	const dialTimeout = 2 * time.Second
	trusting := func(certs ...tls.Certificate) *tls.Config {
		return &tls.Config{RootCAs: ca.Pool(), Certificates: certs}
	}
	wrongName := trusting(clientCert)
	wrongName.ServerName = "wrong.test"
	tests := []struct {
		name     string
		url      string
		tls      *tls.Config
		want     []string // in the error; none for a call that succeeds
		mismatch bool
	}{
		{"right certificate", tlsURL, trusting(clientCert), nil, false},
		{"no certificate", tlsURL, trusting(), []string{"TLS handshake", "client certificate"}, false},
		{"certificate of another CA", tlsURL, forceCert(trusting(), intruder), []string{"TLS handshake", "does not trust the authority"}, false},
		{"name mismatch", tlsURL, wrongName, []string{"TLS handshake", "name mismatch", "wrong.test"}, false},
		{"plaintext client, TLS server", tlsURL, nil, []string{"expects TLS, and this client speaks plaintext dabb"}, true},
		{"TLS client, plaintext server", plainURL, trusting(clientCert), []string{"TLS handshake", "the server speaks plaintext dabb, not TLS"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := []proxy.Option{proxy.WithLogger(quiet), proxy.WithTransport(transport.Config{DialTimeout: dialTimeout}),
				proxy.WithTimeout(2 * dialTimeout)}
			if tt.tls != nil {
				opts = append(opts, proxy.WithTLS(tt.tls))
			}
			c, err := proxy.NewClient(openRegistry(t, tt.url), opts...)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			waitInstances(ctx, t, c, 1)
			start := time.Now()
			_, err = call(ctx, c, "echo")
			took := time.Since(start)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("call: %v", err)
				}
				if got, _ := subject.Load().(string); got != "CN=client,O=dabb" {
					t.Fatalf("the handler saw the client certificate's subject %q, want CN=client,O=dabb", got)
				}
				return
			}
			if took >= dialTimeout {
				t.Fatalf("the call failed after %v, over the dial timeout %v: %v", took, dialTimeout, err)
			}
			if !errors.Is(err, proxy.ErrNotSent) {
				t.Fatalf("err = %v, want one matching proxy.ErrNotSent", err)
			}
			if errors.Is(err, transport.ErrTLSMismatch) != tt.mismatch {
				t.Fatalf("errors.Is(%v, transport.ErrTLSMismatch) = %v, want %v", err, !tt.mismatch, tt.mismatch)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Fatalf("err = %v, want one saying %q", err, w)
				}
			}
			t.Logf("%v: %v", took, err)
		})
	}
}

// TestCertificateRotationUnderLoad: the server and the client each rotate
// their certificate once, mid-run, through their tls.Config hooks. New
// connections use the new certificates; no call fails.
func TestCertificateRotationUnderLoad(t *testing.T) {
	ca := tlstest.NewCA(t, "dabb test CA")
	issue := func(cn string, client bool) *tls.Certificate {
		c := ca.Issue(t, tlstest.Spec{CommonName: cn, IPs: tlstest.Loopback, Client: client})
		return &c
	}
	for _, hook := range []string{"GetCertificate", "GetConfigForClient"} {
		t.Run(hook, func(t *testing.T) {
			var serverCert, clientCert atomic.Pointer[tls.Certificate]
			serverCert.Store(issue("server-1", false))
			clientCert.Store(issue("client-1", true))
			serverTLS := &tls.Config{ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
			getCert := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return serverCert.Load(), nil }
			if hook == "GetCertificate" {
				serverTLS.GetCertificate = getCert
			} else {
				serverTLS.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
					return &tls.Config{Certificates: []tls.Certificate{*serverCert.Load()},
						ClientCAs: ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}, nil
				}
			}

			var mu sync.Mutex
			clientsSeen, serversSeen := map[string]int{}, map[string]int{}
			p := newProbe()
			p.record = func(ctx context.Context) {
				if peer, ok := dabb.RemotePeer(ctx); ok && peer.TLS != nil && len(peer.TLS.VerifiedChains) > 0 {
					mu.Lock()
					clientsSeen[peer.TLS.VerifiedChains[0][0].Subject.CommonName]++
					mu.Unlock()
				}
			}
			// One server, two listeners; the registry lists the second
			// only after the rotation, so the client dials anew.
			s := dabb.NewServer(dabb.WithLogger(quiet), dabb.WithTLS(serverTLS))
			if err := s.RegisterService(&probeDesc, p); err != nil {
				t.Fatal(err)
			}
			var addrs []string
			var serving sync.WaitGroup
			for range 2 {
				l, err := net.Listen("tcp", "127.0.0.1:0")
				if err != nil {
					t.Fatal(err)
				}
				addrs = append(addrs, l.Addr().String())
				serving.Go(func() { _ = s.Serve(l) })
			}
			defer serving.Wait()
			defer s.Close()
			instance := func(addr string) registry.Instance {
				return registry.Instance{Service: probeDesc.Name, ID: addr, Addr: addr}
			}
			reg := static.New(instance(addrs[0]))
			c, err := proxy.NewClient(reg, proxy.WithLogger(quiet), proxy.WithTLS(&tls.Config{
				RootCAs:              ca.Pool(),
				GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return clientCert.Load(), nil },
				VerifyConnection: func(cs tls.ConnectionState) error {
					mu.Lock()
					serversSeen[cs.PeerCertificates[0].Subject.CommonName]++
					mu.Unlock()
					return nil
				},
			}))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()

			rotate := func() {
				serverCert.Store(issue("server-2", false))
				clientCert.Store(issue("client-2", true))
				if err := reg.Register(ctx, instance(addrs[1])); err != nil {
					t.Error(err)
				}
				if err := reg.Deregister(ctx, instance(addrs[0])); err != nil {
					t.Error(err)
				}
			}
			d := 2 * time.Second
			if testing.Short() {
				d = time.Second
			}
			calls, errs := load(ctx, 16, d, rotate, func(ctx context.Context) error {
				_, err := call(ctx, c, "echo")
				return err
			})
			mu.Lock()
			defer mu.Unlock()
			t.Logf("%d calls; the server saw clients %v, the client saw servers %v", calls, clientsSeen, serversSeen)
			if len(errs) > 0 {
				t.Fatalf("%d of %d calls failed across the rotation; first: %v", len(errs), calls, errs[0])
			}
			for _, want := range []struct {
				seen map[string]int
				cn   string
			}{{clientsSeen, "client-1"}, {clientsSeen, "client-2"}, {serversSeen, "server-1"}, {serversSeen, "server-2"}} {
				if want.seen[want.cn] == 0 {
					t.Errorf("no connection presented %s: the rotation did not take", want.cn)
				}
			}
		})
	}
}

// TestPlaintextServerLogsTLSClientOnce: the server logs a TLS client of
// its plaintext port once a minute, however often it connects.
func TestPlaintextServerLogsTLSClientOnce(t *testing.T) {
	var logs strings.Builder
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(b []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(b)
	}), nil))
	_, addr := startServer(t, newProbe(), dabb.WithLogger(logger))
	ca := tlstest.NewCA(t, "dabb test CA")
	for i := range 3 {
		c := newClientWith(t, []proxy.Option{proxy.WithTLS(&tls.Config{RootCAs: ca.Pool()}),
			proxy.WithTransport(transport.Config{DialTimeout: time.Second})}, addr)
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		_, err := call(ctx, c, "echo")
		cancel()
		if !errors.Is(err, transport.ErrTLSMismatch) {
			t.Fatalf("call %d: err = %v, want one matching transport.ErrTLSMismatch", i, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if n := strings.Count(logs.String(), "a TLS client called this plaintext server"); n != 1 {
		t.Fatalf("the server logged the TLS client %d times, want once:\n%s", n, logs.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(b []byte) (int, error) { return f(b) }

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
