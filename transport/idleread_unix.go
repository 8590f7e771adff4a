//go:build unix

// Waiting for a socket to be readable without a read buffer.

package transport

import (
	"errors"
	"net"
	"syscall"
)

// rawConnOf returns nc's syscall.RawConn, or nil when nc is not one of
// the net package's sockets (a TLS connection, a pipe).
func rawConnOf(nc net.Conn) syscall.RawConn {
	c, ok := nc.(syscall.Conn)
	if !ok {
		return nil
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return nil
	}
	return rc
}

// check is called by the poller's RawConn.Read: it reports whether the
// socket has bytes to read, has hit end of file or failed. When it has
// none, it lends the read buffer before the poller parks the goroutine.
func (ir *idleReader) check(fd uintptr) bool {
	ir.calls++
	if ir.calls > 1 {
		// Woken by the poller: bytes came after the peek found none
		// (or the socket closed or failed).
		return true
	}
	// The peek is needed before any wait: the poller's readiness was
	// reset before this call, and bytes that came before it would wake
	// no one.
	_, _, err := syscall.Recvfrom(int(fd), ir.peek[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	if !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK) {
		return true
	}
	ir.lend()
	return false
}

// socketPeek says whether socketPending can look at a socket here.
const socketPeek = true

// socketPending reports whether the socket rc has bytes to read now,
// without reading them. It reports true when rc is nil (TLS, not a
// socket): what cannot be looked at counts as waiting. A closed or failed
// socket has none: its next read says so.
func socketPending(rc syscall.RawConn) bool {
	if rc == nil {
		return true
	}
	var has bool
	err := rc.Control(func(fd uintptr) {
		// A buffer of its own: the connection's reader may be another
		// goroutine by now.
		var b [1]byte
		n, _, perr := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		has = perr == nil && n > 0
	})
	return has || err != nil
}
