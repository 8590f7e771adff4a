// TLS at both ends: the handshakes, and what each side says to a peer that speaks the other protocol.

package transport

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// ErrTLSMismatch is matched by the error of a connection on which one side
// speaks TLS and the other plaintext dabb. Such a connection runs no call:
// its calls fail not sent.
var ErrTLSMismatch = errors.New("transport: TLS on one side only")

// mismatchError is a connection refused because its two sides disagree
// about TLS. serverTLS tells which side speaks it.
type mismatchError struct {
	addr      string
	serverTLS bool
	err       error // what the handshake said, if it ran
}

func (e *mismatchError) Error() string {
	if e.serverTLS {
		return "transport: " + e.addr + " expects TLS, and this client speaks plaintext dabb: give the client a TLS config"
	}
	return "transport: TLS handshake with " + e.addr + " failed: the server speaks plaintext dabb, not TLS"
}

func (e *mismatchError) Is(target error) bool { return target == ErrTLSMismatch }

func (e *mismatchError) Unwrap() error { return e.err }

// tlsRecord reports whether b starts like a TLS record: an alert (0x15)
// or a handshake (0x16) of version 3.x.
func tlsRecord(b []byte) bool { return len(b) >= 2 && (b[0] == 0x15 || b[0] == 0x16) && b[1] == 0x03 }

// dabbFrame reports whether b starts with dabb's magic, 0xdabb.
func dabbFrame(b []byte) bool { return len(b) >= 2 && b[0] == 0xda && b[1] == 0xbb }

// alertRecord is the TLS record a TLS server answers a plaintext dabb
// client with: a fatal unexpected_message alert, record version 1.2.
var alertRecord = []byte{0x15, 0x03, 0x03, 0x00, 0x02, 0x02, 0x0a}

// msgPlaintextOnly is the message of the frame a plaintext server answers
// a TLS client with.
const msgPlaintextOnly = "this server speaks plaintext dabb, not TLS"

// handshake runs the client's TLS handshake on nc, within ctx (the
// dial's). It closes nc when it fails.
func (e *endpoint) handshake(ctx context.Context, nc net.Conn) (net.Conn, error) {
	// A clone per dial: the handshake must not share state with other
	// dials, and the hooks the user set run on every handshake.
	cfg := e.p.cfg.TLS.Clone()
	if cfg.ServerName == "" {
		cfg.ServerName = e.serverName()
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = nc.Close()
		return nil, handshakeError(e.addr, err)
	}
	return tc, nil
}

// serverName returns the name to verify e's server against: the
// Config.ServerName hook's answer, or the host of the address.
func (e *endpoint) serverName() string {
	if f := e.p.cfg.ServerName; f != nil {
		if name := f(e.addr); name != "" {
			return name
		}
	}
	host, _, err := net.SplitHostPort(e.addr)
	if err != nil {
		return e.addr
	}
	return host
}

// handshakeError words a failed client handshake with addr: TLS, and the
// cause a person can act on.
func handshakeError(addr string, err error) error {
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && dabbFrame(rh.RecordHeader[:]) {
		return &mismatchError{addr: addr, err: err}
	}
	return fmt.Errorf("transport: TLS handshake with %s failed: %s: %w", addr, tlsCause(err), err)
}

// tlsCause names why a client handshake failed, in a few words.
func tlsCause(err error) string {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		op       *net.OpError
	)
	switch {
	case errors.As(err, &unknown):
		return "the server's certificate is signed by an unknown authority"
	case errors.As(err, &hostname):
		return "name mismatch: the server's certificate is not valid for " + hostname.Host
	case errors.As(err, &invalid):
		return "the server's certificate is invalid"
	case errors.As(err, &op) && op.Op == "remote error":
		// The server sent an alert: it refused this client.
		switch op.Err.Error() {
		case "tls: certificate required":
			return "the server requires a client certificate and none was sent"
		case "tls: unknown certificate authority":
			return "the server does not trust the authority of this client's certificate"
		case "tls: bad certificate":
			return "the server rejected this client's certificate (bad certificate)"
		case "tls: handshake failure":
			// TLS 1.2 says no more when a required certificate is missing.
			return "the server refused the handshake (no client certificate it accepts, or no common cipher or version)"
		}
		return "the server refused the handshake"
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, os.ErrDeadlineExceeded):
		return "no answer within the dial timeout"
	case errors.Is(err, io.EOF):
		return "the server closed the connection"
	}
	return "handshake error"
}

// refusedError words the first read of a client connection when it shows
// that the server never took the connection: a TLS record where a dabb
// frame should be, or a TLS alert right after the handshake. It returns
// nil for any other outcome.
func refusedError(addr string, tlsConn bool, first []byte, err error) error {
	var op *net.OpError
	switch {
	case err == nil && !tlsConn && tlsRecord(first):
		return &mismatchError{addr: addr, serverTLS: true}
	case err != nil && tlsConn && errors.As(err, &op) && op.Op == "remote error":
		// Under TLS 1.3 the client's handshake ends before the server has
		// checked the client's certificate. A refusal arrives as the
		// first read's alert. The server read no request.
		return fmt.Errorf("transport: TLS handshake with %s failed: %s: %w", addr, tlsCause(err), err)
	}
	return nil
}

// handshake runs the server's TLS handshake on the connection's own
// goroutine, within HandshakeTimeout, and records the peer's TLS state.
// It reports false when the connection must close. A plaintext dabb client
// gets a TLS alert record first.
func (sc *serverConn) handshake(tc *tls.Conn) bool {
	s := sc.s
	_ = tc.SetDeadline(time.Now().Add(s.cfg.HandshakeTimeout))
	err := tc.HandshakeContext(s.base)
	if err == nil {
		_ = tc.SetDeadline(time.Time{})
		st := tc.ConnectionState()
		sc.peer.TLS = &st
		return true
	}
	raw := tc.NetConn()
	if s.base.Err() != nil {
		// Close cut the handshake short: no fault of the peer's to log.
		_ = raw.Close()
		return false
	}
	var rh tls.RecordHeaderError
	if errors.As(err, &rh) && rh.Conn != nil && dabbFrame(rh.RecordHeader[:]) {
		// The client reads this record where a frame's magic should be.
		// It knows then that this server expects TLS and ran nothing.
		_, _ = raw.Write(alertRecord)
		s.logPeer(raw.RemoteAddr(), "transport: a plaintext dabb client called this TLS server; answered with a TLS alert")
	} else {
		s.logPeer(raw.RemoteAddr(), "transport: TLS handshake failed; closing the connection", "err", err)
	}
	lingerClose(raw)
	return false
}

// answerTLSClient answers a TLS client on a plaintext connection with one
// dabb frame, status 40, and closes. The client's handshake reads dabb's
// magic where a TLS record should be, and says so.
func (sc *serverConn) answerTLSClient() {
	var m protocol.Message
	m.Header.Init(protocol.MakeFlags(0, 0), protocol.StatusBadRequest, 0)
	m.Payload = []byte(msgPlaintextOnly)
	_ = sc.nc.SetWriteDeadline(time.Now().Add(lingerTimeout))
	_, _ = sc.nc.Write(protocol.AppendMessage(nil, &m))
	sc.s.logPeer(sc.nc.RemoteAddr(), "transport: a TLS client called this plaintext server; answered in plaintext dabb")
	lingerClose(sc.nc)
}

// lingerTimeout bounds how long a refused connection waits for its peer
// to close first.
const lingerTimeout = time.Second

// lingerClose half-closes nc and reads until the peer closes, for at most
// lingerTimeout. Closing at once, with the peer's bytes unread, would
// reset the connection. The peer could then lose the answer before
// reading it.
func lingerClose(nc net.Conn) {
	if cw, ok := nc.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	_ = nc.SetReadDeadline(time.Now().Add(lingerTimeout))
	_, _ = io.Copy(io.Discard, io.LimitReader(nc, 1<<20))
}

// peerLogEvery is how often the server logs refused connections of one
// peer (IP) at most.
const peerLogEvery = time.Minute

// maxPeerLog bounds the peers the server remembers for peerLogEvery.
const maxPeerLog = 1024

// logPeer logs a refused connection from addr at warning level, unless
// one from the same IP was logged in the last minute.
func (s *Server) logPeer(addr net.Addr, msg string, args ...any) {
	ip := addr.String()
	if host, _, err := net.SplitHostPort(ip); err == nil {
		ip = host
	}
	now := time.Now()
	s.peerLogMu.Lock()
	if last, ok := s.peerLogged[ip]; ok && now.Sub(last) < peerLogEvery {
		s.peerLogMu.Unlock()
		return
	}
	if s.peerLogged == nil {
		s.peerLogged = make(map[string]time.Time)
	}
	if len(s.peerLogged) >= maxPeerLog {
		for k, t := range s.peerLogged {
			if now.Sub(t) >= peerLogEvery {
				delete(s.peerLogged, k)
			}
		}
		if len(s.peerLogged) >= maxPeerLog {
			clear(s.peerLogged) // a flood: forget, and log again
		}
	}
	s.peerLogged[ip] = now
	s.peerLogMu.Unlock()
	s.log.Warn(msg, append(args, "remote", addr)...)
}
