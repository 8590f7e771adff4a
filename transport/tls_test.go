package transport

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"log/slog"
	"net"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/tlstest"
	"github.com/dabbrpc/dabb/protocol"
)

// testPKI holds the authorities and certificates of the TLS tests.
type testPKI struct {
	ca, other     *tlstest.CA
	server        tls.Certificate // 127.0.0.1 and dabb.test, from ca
	nameOnly      tls.Certificate // dabb.test only, from ca
	client        tls.Certificate // CN client, from ca
	clientOfOther tls.Certificate // from other
	serverOfOther tls.Certificate // 127.0.0.1, from other
}

func newPKI(t testing.TB) *testPKI {
	ca, other := tlstest.NewCA(t, "dabb test CA"), tlstest.NewCA(t, "another CA")
	return &testPKI{
		ca: ca, other: other,
		server:        ca.Issue(t, tlstest.Spec{CommonName: "server", DNSNames: []string{"dabb.test"}, IPs: tlstest.Loopback}),
		nameOnly:      ca.Issue(t, tlstest.Spec{CommonName: "named", DNSNames: []string{"dabb.test"}}),
		client:        ca.Issue(t, tlstest.Spec{CommonName: "client", Organization: "dabb", Client: true}),
		clientOfOther: other.Issue(t, tlstest.Spec{CommonName: "intruder", Client: true}),
		serverOfOther: other.Issue(t, tlstest.Spec{CommonName: "impostor", IPs: tlstest.Loopback}),
	}
}

// serverTLS is an mTLS server config presenting cert.
func (k *testPKI) serverTLS(cert tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: k.ca.Pool(), ClientAuth: tls.RequireAndVerifyClientCert}
}

// clientTLS trusts ca and presents certs (none if empty).
func (k *testPKI) clientTLS(certs ...tls.Certificate) *tls.Config {
	return &tls.Config{Certificates: certs, RootCAs: k.ca.Pool()}
}

// peerEcho answers with the client certificate's common name, or
// "plaintext" on a connection without TLS.
var peerEcho = HandlerFunc(func(ctx context.Context, _, resp *protocol.Message) {
	p, ok := RemotePeer(ctx)
	switch {
	case !ok:
		resp.Payload = append(resp.Payload[:0], "no peer"...)
	case p.TLS == nil:
		resp.Payload = append(resp.Payload[:0], "plaintext"...)
	case len(p.TLS.VerifiedChains) == 0:
		resp.Payload = append(resp.Payload[:0], "unverified"...)
	default:
		resp.Payload = append(resp.Payload[:0], p.TLS.VerifiedChains[0][0].Subject.CommonName...)
	}
})

func roundTrip(t *testing.T, p *Pool, addr string) (string, error) {
	t.Helper()
	resp, err := p.RoundTrip(testCtx(t), addr, newRequest("x"))
	if err != nil {
		return "", err
	}
	defer p.Release(resp)
	return string(resp.Payload), nil
}

func TestTLSCall(t *testing.T) {
	k := newPKI(t)
	ts := startServer(t, peerEcho, ServerConfig{TLS: k.serverTLS(k.server)})
	p := newPool(t, Config{TLS: k.clientTLS(k.client)})
	got, err := roundTrip(t, p, ts.addr)
	if err != nil {
		t.Fatalf("call over mTLS: %v", err)
	}
	if got != "client" {
		t.Fatalf("the handler saw peer %q, want the client certificate's CN, client", got)
	}
}

// TestTLSServerName: a server whose certificate names dabb.test alone is
// verified against that name, from the ServerName hook or from
// TLS.ServerName, and against the address's host (a mismatch) otherwise.
func TestTLSServerName(t *testing.T) {
	k := newPKI(t)
	ts := startServer(t, peerEcho, ServerConfig{TLS: k.serverTLS(k.nameOnly)})
	t.Run("hook", func(t *testing.T) {
		var asked string
		p := newPool(t, Config{TLS: k.clientTLS(k.client), ServerName: func(addr string) string {
			asked = addr
			return "dabb.test"
		}})
		if _, err := roundTrip(t, p, ts.addr); err != nil {
			t.Fatalf("call verifying dabb.test: %v", err)
		}
		if asked != ts.addr {
			t.Errorf("ServerName was asked about %q, want %q", asked, ts.addr)
		}
	})
	t.Run("config", func(t *testing.T) {
		cfg := k.clientTLS(k.client)
		cfg.ServerName = "dabb.test"
		p := newPool(t, Config{TLS: cfg, ServerName: func(string) string { return "wrong.test" }})
		if _, err := roundTrip(t, p, ts.addr); err != nil {
			t.Fatalf("call with TLS.ServerName dabb.test: %v", err)
		}
	})
	t.Run("host", func(t *testing.T) {
		p := newPool(t, Config{TLS: k.clientTLS(k.client), ServerName: func(string) string { return "" }})
		_, err := roundTrip(t, p, ts.addr)
		wantStatus(t, err, protocol.StatusChannelInactive, false, true)
		if msg := err.Error(); !strings.Contains(msg, "TLS") || !strings.Contains(msg, "name mismatch") {
			t.Fatalf("err = %v, want one naming TLS and the name mismatch", err)
		}
	})
}

// TestTLSHandshakeFailures: each failed handshake fails its call not
// sent, within the dial timeout, with an error naming TLS and the cause.
// Under TLS 1.3 the server refuses a client certificate after the
// client's handshake ended; that refusal is not sent either.
func TestTLSHandshakeFailures(t *testing.T) {
	k := newPKI(t)
	const dialTimeout = 3 * time.Second
	tests := []struct {
		name   string
		server tls.Certificate
		client *tls.Config
		want   string
	}{
		{"no client certificate", k.server, k.clientTLS(), "client certificate"},
		{"client certificate of another CA", k.server, forceCert(k.clientTLS(), k.clientOfOther), "does not trust the authority"},
		{"name mismatch", k.nameOnly, k.clientTLS(k.client), "name mismatch"},
		{"server certificate of another CA", k.serverOfOther, k.clientTLS(k.client), "unknown authority"},
	}
	for _, version := range []uint16{tls.VersionTLS12, tls.VersionTLS13} {
		for _, tt := range tests {
			name := tt.name + ", TLS 1.2"
			if version == tls.VersionTLS13 {
				name = tt.name + ", TLS 1.3"
			}
			t.Run(name, func(t *testing.T) {
				var logs lockedBuffer
				scfg := k.serverTLS(tt.server)
				scfg.MaxVersion = version
				ts := startServer(t, peerEcho, ServerConfig{TLS: scfg,
					Logger: slog.New(slog.NewTextHandler(&logs, nil))})
				p := newPool(t, Config{TLS: tt.client, DialTimeout: dialTimeout})
				for i := range 3 {
					start := time.Now()
					_, err := roundTrip(t, p, ts.addr)
					if took := time.Since(start); took >= dialTimeout {
						t.Fatalf("call %d failed after %v, over the dial timeout %v", i, took, dialTimeout)
					}
					wantStatus(t, err, protocol.StatusChannelInactive, false, true)
					if msg := err.Error(); !strings.Contains(msg, "TLS handshake") || !strings.Contains(msg, tt.want) {
						t.Fatalf("call %d: err = %v, want one naming the TLS handshake and %q", i, err, tt.want)
					}
					if errors.Is(err, ErrTLSMismatch) {
						t.Fatalf("call %d: err = %v matches ErrTLSMismatch; both sides speak TLS", i, err)
					}
					eventually(t, "the dial backoff to end", func() bool { return !p.inBackoff(ts.addr) })
				}
				eventually(t, "the server's log of the failed handshake", func() bool {
					return strings.Contains(logs.String(), "TLS handshake failed")
				})
				if n := strings.Count(logs.String(), "TLS handshake failed"); n != 1 {
					t.Errorf("the server logged %d failed handshakes from one peer, want 1 a minute:\n%s", n, logs.String())
				}
			})
		}
	}
}

// TestTLSMismatch: a plaintext client of a TLS server and a TLS client of
// a plaintext server each fail not sent, at once, with one sentence that
// names TLS and what the server speaks. The server logs the peer once.
func TestTLSMismatch(t *testing.T) {
	k := newPKI(t)
	const dialTimeout = 3 * time.Second
	tests := []struct {
		name   string
		server *tls.Config
		client *tls.Config
		want   string
		logged string
	}{
		{"plaintext client, TLS server", k.serverTLS(k.server), nil,
			"expects TLS, and this client speaks plaintext dabb", "a plaintext dabb client called this TLS server"},
		{"TLS client, plaintext server", nil, k.clientTLS(k.client),
			"the server speaks plaintext dabb, not TLS", "a TLS client called this plaintext server"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var logs lockedBuffer
			ts := startServer(t, peerEcho, ServerConfig{TLS: tt.server,
				Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			p := newPool(t, Config{TLS: tt.client, DialTimeout: dialTimeout})
			for i := range 3 {
				start := time.Now()
				_, err := roundTrip(t, p, ts.addr)
				if took := time.Since(start); took >= dialTimeout {
					t.Fatalf("call %d failed after %v, over the dial timeout %v", i, took, dialTimeout)
				}
				wantStatus(t, err, protocol.StatusChannelInactive, false, true)
				if !errors.Is(err, ErrTLSMismatch) {
					t.Fatalf("call %d: err = %v, want one matching ErrTLSMismatch", i, err)
				}
				if msg := err.Error(); !strings.Contains(msg, tt.want) {
					t.Fatalf("call %d: err = %v, want one saying %q", i, err, tt.want)
				}
				if i == 0 && strings.Count(err.Error(), ". ") > 0 {
					t.Fatalf("err = %q is more than one sentence", err)
				}
				// Past the dial backoff, the next call dials again.
				eventually(t, "the dial backoff to end", func() bool { return !p.inBackoff(ts.addr) })
			}
			eventually(t, "the server's log of the peer", func() bool { return strings.Contains(logs.String(), tt.logged) })
			if n := strings.Count(logs.String(), tt.logged); n != 1 {
				t.Errorf("the server logged the peer %d times after 3 connections, want once a minute:\n%s", n, logs.String())
			}
		})
	}
}

// TestTLSSlowHandshake: a client that connects and says nothing stalls
// neither the accept loop nor other clients, and is closed after the
// handshake timeout.
func TestTLSSlowHandshake(t *testing.T) {
	k := newPKI(t)
	ts := startServer(t, peerEcho, ServerConfig{TLS: k.serverTLS(k.server), HandshakeTimeout: 300 * time.Millisecond})
	silent, err := net.Dial("tcp", ts.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	p := newPool(t, Config{TLS: k.clientTLS(k.client)})
	if got, err := roundTrip(t, p, ts.addr); err != nil || got != "client" {
		t.Fatalf("call beside a silent connection = %q, %v; want client, nil", got, err)
	}
	_ = silent.SetReadDeadline(time.Now().Add(defaultTestTimeout))
	start := time.Now()
	var b [1]byte
	if _, err := silent.Read(b[:]); err == nil {
		t.Fatal("the silent connection read a byte, want it closed")
	} else if errors.Is(err, os.ErrDeadlineExceeded) || time.Since(start) > 5*time.Second {
		t.Fatalf("the silent connection was not closed after the handshake timeout: %v", err)
	}
}

// TestTLSPeerOneWay: a one-way call without a budget, which gets no
// handler context of its own, still tells its peer.
func TestTLSPeerOneWay(t *testing.T) {
	k := newPKI(t)
	got := make(chan string, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, _, _ *protocol.Message) {
		p, ok := RemotePeer(ctx)
		switch {
		case !ok:
			got <- "no peer"
		case p.TLS == nil || len(p.TLS.VerifiedChains) == 0:
			got <- "no verified TLS"
		case p.RemoteAddr == nil || p.LocalAddr == nil:
			got <- "no addresses"
		default:
			got <- p.TLS.VerifiedChains[0][0].Subject.CommonName + " to " + p.LocalAddr.String()
		}
	}), ServerConfig{TLS: k.serverTLS(k.server)})
	p := newPool(t, Config{TLS: k.clientTLS(k.client)})
	req := newRequest("x")
	req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest, 22))
	if _, err := p.RoundTrip(testCtx(t), ts.addr, req); err != nil {
		t.Fatal(err)
	}
	if s := waitFor(t, got, "the one-way call"); s != "client to "+ts.addr {
		t.Fatalf("the one-way handler saw %q, want %q", s, "client to "+ts.addr)
	}
}

// inBackoff reports whether addr's dials wait out a backoff.
func (p *Pool) inBackoff(addr string) bool {
	e := (*p.eps.Load())[addr]
	if e == nil {
		return false
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	return time.Now().Before(e.retryAt)
}

// forceCert makes cfg present cert whatever authorities the server asks
// for. A client given the certificate in Certificates would send none.
func forceCert(cfg *tls.Config, cert tls.Certificate) *tls.Config {
	cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &cert, nil }
	return cfg
}

// TestTLSAckedBytes: over TLS the liveness check still reads the socket's
// acknowledged bytes, so a large frame crossing a slow link is progress.
func TestTLSAckedBytes(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux tells acknowledged bytes")
	}
	w, _ := tcpPair(t)
	if _, ok := ackedBytes(tls.Client(w, &tls.Config{})); !ok {
		t.Fatal("ackedBytes cannot tell over a tls.Conn")
	}
}

// TestTLSLargeWriteOutlivesItsLimit: on a TLS connection a large frame
// whose caller's time runs out mid-write is still written whole, and the
// connection lives on. A cut TLS write would lose its record and break
// the connection for every call on it.
func TestTLSLargeWriteOutlivesItsLimit(t *testing.T) {
	k := newPKI(t)
	wc, rc := tcpPair(t)
	cfg := k.clientTLS(k.client)
	cfg.ServerName = "dabb.test"
	client := tls.Client(wc, cfg)
	server := tls.Server(rc, k.serverTLS(k.server))
	handshook := make(chan error, 1)
	go func() { handshook <- server.Handshake() }()
	if err := client.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if err := waitFor(t, handshook, "the server's handshake"); err != nil {
		t.Fatalf("server handshake: %v", err)
	}
	failed := make(chan error, 1)
	var w frameWriter
	w.init(client, func(err error) { failed <- err })

	// Far more than the socket buffers hold: the server reads nothing yet.
	payload := bytes.Repeat([]byte("L"), 8*linkBuffer+largePayload)
	start := time.Now()
	queued, err := w.writeMessage(frameOf(string(payload)), limit{deadline: time.Now().Add(100 * time.Millisecond)})
	if !queued || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("large write = %v, %v; want queued and cut off by its deadline", queued, err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("the large write returned after %v, long past its deadline", took)
	}
	if _, err := w.writeMessage(frameOf("small"), limit{}); err != nil {
		t.Fatalf("small write after the large one: %v", err)
	}
	readRequests(t, server, 1, payload)
	readRequests(t, server, 1, []byte("small"))
	select {
	case err := <-failed:
		t.Fatalf("the writer failed: %v", err)
	default:
	}
}
