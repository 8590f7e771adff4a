//go:build unix

// Socket writes made with the system calls themselves, so a flusher never waits for the socket.

package transport

import (
	"errors"
	"io"
	"net"
	"os"
	"syscall"
)

// rawWriter writes to a socket without ever waiting for room in its send
// buffer. tryWrite makes the write system calls itself, through the
// connection's syscall.RawConn. It stops at EAGAIN, where net.Conn.Write
// would park the goroutine. The fields are the flusher's: one goroutine at
// a time uses them.
type rawWriter struct {
	rc    syscall.RawConn // nil: not one of the net package's sockets
	write func(fd uintptr) bool

	b       []byte
	n       int
	blocked bool
	err     error
}

func (r *rawWriter) init(nc net.Conn) {
	// Only the net package's own sockets: a wrapper that embeds one has
	// its SyscallConn too, but writing under it would skip the wrapper's
	// Write (encryption, metrics, fault injection).
	var sc syscall.Conn
	switch c := nc.(type) {
	case *net.TCPConn:
		sc = c
	case *net.UnixConn:
		sc = c
	default:
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	r.rc = rc
	r.write = r.writeFD // bound once: no allocation per write
}

// tryWrite writes b to nc until it is all written, the write fails, or
// the socket's send buffer is full (blocked: n bytes went out).
func (r *rawWriter) tryWrite(nc net.Conn, b []byte) (n int, blocked bool, err error) {
	if r.rc == nil {
		n, err = nc.Write(b)
		return n, false, err
	}
	r.b, r.n, r.blocked, r.err = b, 0, false, nil
	if err := r.rc.Write(r.write); err != nil {
		r.b = nil
		return r.n, false, &net.OpError{Op: "write", Net: "tcp", Source: nc.LocalAddr(), Addr: nc.RemoteAddr(), Err: err}
	}
	n, blocked, err = r.n, r.blocked, r.err
	r.b, r.err = nil, nil
	if err != nil {
		err = &net.OpError{Op: "write", Net: "tcp", Source: nc.LocalAddr(), Addr: nc.RemoteAddr(), Err: os.NewSyscallError("write", err)}
	}
	return n, blocked, err
}

// writeFD is the RawConn callback. It always returns true: the runtime must
// not wait for the socket to become writable on our behalf.
func (r *rawWriter) writeFD(fd uintptr) bool {
	for r.n < len(r.b) {
		n, err := syscall.Write(int(fd), r.b[r.n:])
		if n > 0 {
			r.n += n
		}
		switch {
		case err == nil && n == 0:
			r.err = io.ErrShortWrite
			return true
		case err == nil:
		case errors.Is(err, syscall.EINTR):
		case errors.Is(err, syscall.EAGAIN):
			r.blocked = true
			return true
		default:
			r.err = err
			return true
		}
	}
	return true
}

// exactCounts: a write cut off by its deadline reports exactly the bytes
// it wrote, so the rest of the frame can be finished.
const exactCounts = true
