package frameworks

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// firstByteListener records the first byte each accepted connection
// reads: 0x16, a TLS handshake record, on a TLS connection.
type firstByteListener struct {
	net.Listener
	mu    sync.Mutex
	first []byte
}

func (l *firstByteListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &firstByteConn{Conn: c, l: l}, nil
}

func (l *firstByteListener) firsts() []byte {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]byte(nil), l.first...)
}

type firstByteConn struct {
	net.Conn
	l    *firstByteListener
	once sync.Once
}

func (c *firstByteConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.once.Do(func() {
			c.l.mu.Lock()
			c.l.first = append(c.l.first, p[0])
			c.l.mu.Unlock()
		})
	}
	return n, err
}

// TestTLS checks that each TLS framework's call succeeds over TLS: the
// reply passes the check, every connection the server accepted began
// with a TLS handshake record, and the server refuses a TLS 1.2 client.
func TestTLS(t *testing.T) {
	for _, f := range Extra() {
		t.Run(f.Name, func(t *testing.T) {
			if !f.TLS {
				t.Fatalf("%s is in Extra but not marked TLS", f.Name)
			}
			inner, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			l := &firstByteListener{Listener: inner}
			srv, err := f.Serve(l)
			if err != nil {
				inner.Close()
				t.Fatal(err)
			}
			defer func() {
				if err := srv.Close(); err != nil {
					t.Errorf("server close: %v", err)
				}
			}()
			c, err := f.Dial(l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			req := benchpb.NewMessage(0)
			reply, err := c.Echo(ctx, req)
			if err == nil {
				err = benchpb.Check(req, reply)
			}
			if err != nil {
				t.Fatalf("echo over TLS: %v", err)
			}
			if err := c.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
				t.Errorf("client close: %v", err)
			}
			firsts := l.firsts()
			if len(firsts) == 0 {
				t.Fatal("the server read nothing")
			}
			for i, b := range firsts {
				if b != 0x16 {
					t.Errorf("connection %d began with %#x, want 0x16 (a TLS handshake record)", i, b)
				}
			}

			cfg, err := clientTLS()
			if err != nil {
				t.Fatal(err)
			}
			cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
			d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 5 * time.Second}, Config: cfg}
			conn, err := d.DialContext(ctx, "tcp", l.Addr().String())
			if err == nil {
				conn.Close()
				t.Fatal("a TLS 1.2 client completed a handshake, want TLS 1.3 only")
			}
		})
	}
}

// TestTLSEnviron checks that TLSEnviron's value, read as a server process
// reads it, gives a certificate for 127.0.0.1 that verifies against this
// process's CA, and that a value that is not the PEM is refused.
func TestTLSEnviron(t *testing.T) {
	env, err := TLSEnviron()
	if err != nil {
		t.Fatal(err)
	}
	v, ok := strings.CutPrefix(env, TLSEnv+"=")
	if !ok {
		t.Fatalf("TLSEnviron() = %.40q..., want %s=...", env, TLSEnv)
	}
	got, err := parseCerts([]byte(v))
	if err != nil {
		t.Fatal(err)
	}
	own, err := certs()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := got.server.Leaf.Verify(x509.VerifyOptions{Roots: own.roots, DNSName: "127.0.0.1"}); err != nil {
		t.Fatalf("the handed-over certificate does not verify for 127.0.0.1 against this process's CA: %v", err)
	}
	for _, bad := range []string{"not PEM", v[:strings.Index(v, "-----END CERTIFICATE-----")+25]} {
		if _, err := parseCerts([]byte(bad)); err == nil {
			t.Errorf("parseCerts accepted %.30q...", bad)
		}
	}
}
