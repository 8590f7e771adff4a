package transport

import (
	"bytes"
	"io"
	"net"
	"runtime"
	"testing"
	"time"
)

// tcpPair returns both ends of a loopback TCP connection with small
// socket buffers, so a large frame keeps its write in progress until the
// peer reads it.
func tcpPair(t *testing.T) (w, r *net.TCPConn) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	acc := make(chan net.Conn, 1)
	go func() {
		c, _ := l.Accept()
		acc <- c
	}()
	c, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := waitFor(t, acc, "the accepted connection")
	if s == nil {
		t.Fatal("accept failed")
	}
	w, r = c.(*net.TCPConn), s.(*net.TCPConn)
	_ = w.SetWriteBuffer(16 << 10)
	_ = r.SetReadBuffer(16 << 10)
	t.Cleanup(func() { w.Close(); r.Close() })
	return w, r
}

// TestSlowPeerIsNotAStall: a large frame written to a peer that reads it
// slowly takes many heartbeat ticks and is not taken for a stall; once
// the peer stops reading, it is, within a few ticks.
func TestSlowPeerIsNotAStall(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the peer's acknowledgements are read on Linux only")
	}
	wc, rc := tcpPair(t)
	var w frameWriter
	w.init(wc, func(error) {})
	const size = 2 << 20
	done := make(chan error, 1)
	go func() {
		_, err := w.writeMessage(newRequest(string(bytes.Repeat([]byte{'x'}, size))))
		done <- err
	}()

	// The peer reads 16 KiB every 5 ms (~3 MB/s) and the connection
	// ticks every 20 ms: the frame needs ~35 ticks, far past stuckTicks.
	var l liveness
	buf := make([]byte, 16<<10)
	read, ticks := 0, 0
	next := time.Now().Add(20 * time.Millisecond)
	for read < size/2 {
		n, err := rc.Read(buf)
		if err != nil {
			t.Fatalf("peer read: %v", err)
		}
		read += n
		time.Sleep(5 * time.Millisecond) // the slow peer's pace
		if time.Now().After(next) {
			next = next.Add(20 * time.Millisecond)
			ticks++
			l.reads.Add(1) // the peer answers heartbeats: only the write is watched
			if a := l.tick(w.stalled()); a == tickStalled {
				t.Fatalf("a frame the peer was reading (%d of %d bytes after %d ticks) was taken for a stall", read, size, ticks)
			}
		}
	}
	if ticks <= stuckTicks {
		t.Fatalf("the write lasted only %d ticks; the test needs more than %d", ticks, stuckTicks)
	}

	// The peer stops reading: once the buffers are full nothing is
	// acknowledged, and the ticks see a stall.
	stalled := false
	for i := 0; i < stuckTicks+20 && !stalled; i++ {
		time.Sleep(20 * time.Millisecond)
		l.reads.Add(1)
		stalled = l.tick(w.stalled()) == tickStalled
	}
	if !stalled {
		t.Fatalf("a peer that stopped reading was not seen as a stall within %d ticks", stuckTicks+20)
	}
	go func() { _, _ = io.Copy(io.Discard, rc) }()
	if err := waitFor(t, done, "the large write to finish"); err != nil {
		t.Fatalf("write: %v", err)
	}
}
