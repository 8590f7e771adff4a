// Idle connections' read buffers: lent to a shared free list while a connection waits for bytes.

package transport

import (
	"bufio"
	"io"
	"net"
	"sync"
	"syscall"
)

// lendFrom is the number of connections above which a connection's read
// buffer is lent while it waits. Below it the buffers cost little (4 MiB
// at most), and the peek before each wait would be a system call per
// batch of frames on a busy connection for nothing.
const lendFrom = 256

// maxFreeReaders bounds the free list of read buffers: beyond it, the
// buffers of connections going idle go back to the garbage collector.
const maxFreeReaders = 256

// freeReaders holds read buffers (bufio.Readers reading from nothing) for
// the connections that wake up. A bounded list rather than a sync.Pool:
// it keeps a few buffers across collections, and takes and gives the same
// way every time.
var freeReaders struct {
	mu   sync.Mutex
	list []*bufio.Reader
}

// newReader returns a read buffer of readBufferSize reading from src.
func newReader(src io.Reader) *bufio.Reader {
	freeReaders.mu.Lock()
	var br *bufio.Reader
	if n := len(freeReaders.list); n > 0 {
		br = freeReaders.list[n-1]
		freeReaders.list[n-1] = nil
		freeReaders.list = freeReaders.list[:n-1]
	}
	freeReaders.mu.Unlock()
	if br == nil {
		return bufio.NewReaderSize(src, readBufferSize)
	}
	br.Reset(src)
	return br
}

// freeReader gives br, which holds no bytes, to the free list.
func freeReader(br *bufio.Reader) {
	br.Reset(nil)
	freeReaders.mu.Lock()
	if len(freeReaders.list) < maxFreeReaders {
		freeReaders.list = append(freeReaders.list, br)
	}
	freeReaders.mu.Unlock()
}

// idleReader lends a connection's read buffer to the free list while the
// connection waits for bytes that have not come. It is the reader
// goroutine's alone.
type idleReader struct {
	rc       syscall.RawConn       // nil: the buffer is kept (TLS, not a socket)
	readable func(fd uintptr) bool // ir.check, made once
	br       *bufio.Reader         // the connection's, during wait
	spare    *bufio.Reader         // an empty Reader to carry the buffer to the free list
	calls    int                   // of readable, during wait
	lent     bool                  // br's buffer is in the free list
	peek     [1]byte
}

func newIdleReader(nc net.Conn) idleReader {
	return idleReader{rc: rawConnOf(nc)}
}

// wait blocks until the socket has bytes to read (or is closed or
// failed). When it has none now, br's buffer goes to the free list for
// the wait, and br gets one again, reading from src, after it. br must
// hold no buffered bytes. A connection whose bytes are there pays one
// system call, a peek; one whose bytes are not pays it instead of the
// read that would have found none.
func (ir *idleReader) wait(br *bufio.Reader, src io.Reader) {
	if ir.rc == nil {
		return
	}
	if ir.readable == nil {
		ir.readable = ir.check
	}
	ir.br, ir.calls, ir.lent = br, 0, false
	_ = ir.rc.Read(ir.readable)
	ir.br = nil
	if !ir.lent {
		return
	}
	got := newReader(src)
	// bufio.Reader holds no pointer into itself: its state may move
	// from one value to another.
	*br = *got
	*got = bufio.Reader{}
	ir.spare = got
}

// lend moves ir.br's buffer to the free list, leaving ir.br empty.
func (ir *idleReader) lend() {
	held := ir.spare
	if held == nil {
		held = new(bufio.Reader)
	}
	ir.spare = nil
	*held = *ir.br
	*ir.br = bufio.Reader{}
	freeReader(held)
	ir.lent = true
}
