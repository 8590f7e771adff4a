// The peer's acknowledged bytes, read from TCP_INFO.

package transport

import (
	"crypto/tls"
	"net"
	"syscall"

	"golang.org/x/sys/unix"
)

// ackedBytes returns how many bytes written on nc the peer has
// acknowledged (TCP_INFO's tcpi_bytes_acked), and false where the
// connection cannot tell. The count stops moving once the peer stops
// reading and its receive window is full, so it tells a slow link from a
// peer that stopped reading.
func ackedBytes(nc net.Conn) (uint64, bool) {
	if tc, ok := nc.(*tls.Conn); ok {
		nc = tc.NetConn() // TLS records are bytes on the socket too
	}
	sc, ok := nc.(syscall.Conn)
	if !ok {
		return 0, false
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return 0, false
	}
	var info *unix.TCPInfo
	cerr := rc.Control(func(fd uintptr) {
		info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO)
	})
	if cerr != nil || err != nil {
		return 0, false
	}
	return info.Bytes_acked, true
}
