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
	if readable(fd, ir.peek[:]) {
		return true
	}
	ir.lend()
	return false
}

// readable peeks at the socket fd without waiting, into b (one byte): it
// reports whether a read would not wait, because bytes are there or the
// socket hit end of file or failed.
func readable(fd uintptr, b []byte) bool {
	_, _, err := syscall.Recvfrom(int(fd), b, syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return !errors.Is(err, syscall.EAGAIN) && !errors.Is(err, syscall.EWOULDBLOCK)
}

// socketPending reports whether a read of the socket rc would not wait
// (readable). It reports true when rc is nil (TLS, not a socket): what
// cannot be looked at counts as waiting.
func socketPending(rc syscall.RawConn) bool {
	if rc == nil {
		return true
	}
	has := true
	_ = rc.Control(func(fd uintptr) {
		// A buffer of its own: the connection's reader may be another
		// goroutine by now.
		var b [1]byte
		has = readable(fd, b[:])
	})
	return has
}
