// The client's TCP connections: bounded handshakes and the session timeout granted.

package zk

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"
)

// dialer makes the client's TCP connections. It does what the client
// library does not:
//
//   - It bounds the session handshake. The library waits up to ten times
//     two thirds of the session timeout (over a minute by default) for a
//     server to answer its connect request, and tries no other server
//     meanwhile; a server that accepts connections but does not serve (one
//     that is starting, or hung) would stall reconnection that long. Like
//     ZooKeeper's Java client, the handshake gets the session timeout
//     divided by the number of servers: the one asked for until ZooKeeper
//     has granted one, then the one granted.
//   - It reads the session timeout ZooKeeper granted out of the server's
//     connect response, which the library keeps to itself.
//   - It remembers whether its latest connection attempt failed, or its
//     latest connection broke, so that the registry can tell a ZooKeeper
//     it cannot reach from a slow one.
//   - It lets Close cut connections that are still stuck, so Close returns
//     promptly.
type dialer struct {
	servers int

	mu        sync.Mutex // guards following
	handshake time.Duration
	granted   time.Duration // the session timeout of the latest session ZooKeeper granted; 0 before one
	failed    error         // what ended the latest connection, or the latest attempt to make one; nil while it is open
	closed    bool
	conns     map[*handshakeConn]struct{}
}

var errDialerClosed = errors.New("zk: registry closed")

func newDialer(sessionTimeout time.Duration, servers int) *dialer {
	servers = max(servers, 1)
	return &dialer{servers: servers, handshake: handshakeFor(sessionTimeout, servers), conns: make(map[*handshakeConn]struct{})}
}

// handshakeFor returns the handshake bound for a session timeout: a share
// of it per server, at least half a second.
func handshakeFor(sessionTimeout time.Duration, servers int) time.Duration {
	return max(sessionTimeout/time.Duration(servers), 500*time.Millisecond)
}

// dial has the signature of the library's Dialer.
func (d *dialer) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	d.mu.Lock()
	closed := d.closed
	d.mu.Unlock()
	if closed {
		return nil, errDialerClosed
	}
	c, err := net.DialTimeout(network, addr, timeout)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.failed = err
	if err != nil {
		return nil, err
	}
	if d.closed {
		c.Close()
		return nil, errDialerClosed
	}
	hc := &handshakeConn{Conn: c, d: d, handshaking: true}
	d.conns[hc] = struct{}{}
	return hc, nil
}

// lastFailure returns what ended the latest connection (a read error:
// the server closed it, or went silent), or the error of the latest
// attempt to make one; nil while the latest connection is open, after
// the library closed it, or before any attempt.
func (d *dialer) lastFailure() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.failed
}

// sessionTimeout returns the session timeout ZooKeeper granted for the
// latest session, or 0 before the first.
func (d *dialer) sessionTimeout() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.granted
}

// handshakeBound returns the bound of a handshake.
func (d *dialer) handshakeBound() time.Duration {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.handshake
}

// setGranted records the session timeout of a session ZooKeeper granted.
func (d *dialer) setGranted(t time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.granted = t
	d.handshake = handshakeFor(t, d.servers)
}

// broken records the read error that ends c, unless the library (or
// closeAll) closed it.
func (d *dialer) broken(c *handshakeConn, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, open := d.conns[c]; open {
		d.failed = fmt.Errorf("connection to %s lost: %w", c.RemoteAddr(), err)
	}
}

// closeAll closes every open connection and refuses new ones.
func (d *dialer) closeAll() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	for c := range d.conns {
		c.Conn.Close()
	}
	clear(d.conns)
}

// connectResponseHead is what the dialer reads of the server's connect
// response, the first frame the server sends on a connection: the frame's
// length, the protocol version, the session timeout granted (ms) and the
// session ID, as big-endian integers of 4, 4, 4 and 8 bytes.
const connectResponseHead = 4 + 4 + 4 + 8

// handshakeConn caps the deadlines the library sets until the handshake
// is over: the library clears its read deadline once the connect response
// has arrived; from then on its deadlines pass through unchanged. It also
// reads the session timeout granted out of the connect response.
type handshakeConn struct {
	net.Conn
	d *dialer

	mu          sync.Mutex // guards handshaking
	handshaking bool       // until the library clears its read deadline

	// Only Read uses these; the library never reads a connection from two
	// goroutines at once.
	head    []byte // the connect response's first bytes, until complete
	sniffed bool   // head has been read
}

func (c *handshakeConn) capped(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	if limit := time.Now().Add(c.d.handshakeBound()); t.After(limit) {
		return limit
	}
	return t
}

// Read reads from the connection, picking the session timeout granted out
// of the connect response on the way, and records an error that ends it.
func (c *handshakeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if !c.sniffed && n > 0 {
		c.sniff(b[:n])
	}
	if err != nil {
		c.d.broken(c, err)
	}
	return n, err
}

func (c *handshakeConn) sniff(b []byte) {
	c.head = append(c.head, b[:min(len(b), connectResponseHead-len(c.head))]...)
	if len(c.head) < connectResponseHead {
		return
	}
	c.sniffed = true
	timeout := time.Duration(int32(binary.BigEndian.Uint32(c.head[8:12]))) * time.Millisecond
	session := int64(binary.BigEndian.Uint64(c.head[12:20]))
	c.head = nil
	// Session 0: the server refused to renew an expired session; the
	// client asks for a new one.
	if session != 0 && timeout > 0 {
		c.d.setGranted(timeout)
	}
}

func (c *handshakeConn) SetDeadline(t time.Time) error {
	c.mu.Lock()
	if c.handshaking {
		t = c.capped(t)
	}
	c.mu.Unlock()
	return c.Conn.SetDeadline(t)
}

func (c *handshakeConn) SetReadDeadline(t time.Time) error {
	c.mu.Lock()
	if c.handshaking {
		if t.IsZero() {
			c.handshaking = false // the connect response has been read
		} else {
			t = c.capped(t)
		}
	}
	c.mu.Unlock()
	return c.Conn.SetReadDeadline(t)
}

func (c *handshakeConn) SetWriteDeadline(t time.Time) error {
	c.mu.Lock()
	if c.handshaking {
		t = c.capped(t)
	}
	c.mu.Unlock()
	return c.Conn.SetWriteDeadline(t)
}

func (c *handshakeConn) Close() error {
	c.d.mu.Lock()
	delete(c.d.conns, c)
	c.d.mu.Unlock()
	return c.Conn.Close()
}

// Dialer makes a ZooKeeper client's TCP connections as Registry makes its
// own, for a package that keeps a client of its own (the dubbo module's
// reader): each session handshake is bounded by the session timeout
// divided by the number of servers (at least 500 ms), the session timeout
// ZooKeeper granted is read out of the connect response, and CloseAll
// cuts the connections still open. Pass Dial to the client with
// zk.WithDialer. It is safe for concurrent use.
type Dialer struct{ d *dialer }

// NewDialer returns a Dialer for a client of servers servers that asks
// for sessionTimeout.
func NewDialer(sessionTimeout time.Duration, servers int) *Dialer {
	return &Dialer{newDialer(sessionTimeout, servers)}
}

// Dial has the signature of the client library's Dialer.
func (d *Dialer) Dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	return d.d.dial(network, addr, timeout)
}

// SessionTimeout returns the session timeout ZooKeeper granted for the
// latest session, or 0 before the first.
func (d *Dialer) SessionTimeout() time.Duration { return d.d.sessionTimeout() }

// LastFailure returns what ended the latest connection, or the error of
// the latest attempt to make one; nil while the latest connection is
// open, after the client closed it, or before any attempt.
func (d *Dialer) LastFailure() error { return d.d.lastFailure() }

// CloseAll closes every open connection and refuses new ones. Call it
// after closing the client: the client's Close does not end a handshake
// in progress, which would otherwise run to the library's own bound, ten
// times two thirds of the session timeout.
func (d *Dialer) CloseAll() { d.d.closeAll() }
