//go:build !unix

// Socket writes through net.Conn.Write where the system calls are not ours to make.

package transport

import "net"

// rawWriter writes with net.Conn.Write where the socket's system calls are
// not ours to make: a flusher may wait for room in the send buffer.
type rawWriter struct{}

func (*rawWriter) init(net.Conn) {}

func (*rawWriter) tryWrite(nc net.Conn, b []byte) (n int, blocked bool, err error) {
	n, err = nc.Write(b)
	return n, false, err
}

// exactCounts is false here. On Windows a write cut off by its deadline
// may report 0 bytes although some went out (golang/go#24727). The rest of
// the frame is then unknown, so the connection closes instead.
const exactCounts = false
