//go:build !unix

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
