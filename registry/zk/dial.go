package zk

import (
	"errors"
	"net"
	"sync"
	"time"
)

// dialer makes the client's TCP connections. It does two things the client
// library does not:
//
//   - It bounds the session handshake. The library waits up to ten times
//     two thirds of the session timeout (over a minute by default) for a
//     server to answer its connect request, and tries no other server
//     meanwhile; a server that accepts connections but does not serve (one
//     that is starting, or hung) would stall reconnection that long. Like
//     ZooKeeper's Java client, the handshake gets the session timeout
//     divided by the number of servers.
//   - It lets Close cut connections that are still stuck, so Close returns
//     promptly.
type dialer struct {
	handshake time.Duration

	mu     sync.Mutex // guards following
	closed bool
	conns  map[*handshakeConn]struct{}
}

var errDialerClosed = errors.New("zk: registry closed")

func newDialer(sessionTimeout time.Duration, servers int) *dialer {
	h := sessionTimeout / time.Duration(max(servers, 1))
	return &dialer{handshake: max(h, 500*time.Millisecond), conns: make(map[*handshakeConn]struct{})}
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
	if err != nil {
		return nil, err
	}
	hc := &handshakeConn{Conn: c, d: d, handshaking: true}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		c.Close()
		return nil, errDialerClosed
	}
	d.conns[hc] = struct{}{}
	return hc, nil
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

// handshakeConn caps the deadlines the library sets until the handshake
// is over. The library clears its read deadline once the connect response
// has arrived; from then on its deadlines pass through unchanged.
type handshakeConn struct {
	net.Conn
	d *dialer

	mu          sync.Mutex // guards handshaking
	handshaking bool       // until the library clears its read deadline
}

func (c *handshakeConn) capped(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	if limit := time.Now().Add(c.d.handshake); t.After(limit) {
		return limit
	}
	return t
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
