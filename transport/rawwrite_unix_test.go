//go:build unix

package transport

import (
	"bufio"
	"io"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// TestRawWriteNeverWaitsOnAFullSocket guards rawWriter, the write system
// calls the flusher makes itself. A peer reads nothing until far more
// small frames were written than the socket buffers hold; every
// writeMessage must still return. With net.Conn.Write the first one would
// wait until the peer reads.
func TestRawWriteNeverWaitsOnAFullSocket(t *testing.T) {
	wc, rc := tcpPair(t)
	var w frameWriter
	w.init(wc, func(err error) { t.Errorf("unexpected write error: %v", err) })
	if w.raw.rc == nil {
		t.Fatal("a *net.TCPConn got no raw writer")
	}
	const frames = 64 // 2 MiB of 32 KiB frames: several times the buffers tcpPair sets
	payload := strings.Repeat("s", 32<<10)
	done := make(chan error, 1)
	go func() {
		for range frames {
			if _, err := w.writeMessage(frameOf(payload), limit{}); err != nil {
				done <- err
				return
			}
		}
		done <- nil
	}()
	if err := waitFor(t, done, "small frames written to a peer that reads nothing (rawWriter "+
		"lets a flusher hand a full socket's rest to finish and return, so no small call waits on a stopped peer)"); err != nil {
		t.Fatal(err)
	}
	rd := protocol.NewReader(bufio.NewReader(rc), 0)
	for i := range frames {
		var m protocol.Message
		if err := rd.Read(&m); err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if string(m.Payload) != payload {
			t.Fatalf("frame %d arrived with %d bytes, want %d", i, len(m.Payload), len(payload))
		}
	}
	eventually(t, "the writer to finish", w.idle)
}

// TestRawWriteAllocatesNothing guards the callback rawWriter binds once:
// a write through the RawConn must not allocate.
func TestRawWriteAllocatesNothing(t *testing.T) {
	wc, rc := tcpPair(t)
	go func() { _, _ = io.Copy(io.Discard, rc) }()
	var r rawWriter
	r.init(wc)
	b := []byte("a small frame")
	allocs := testing.AllocsPerRun(100, func() {
		if _, blocked, err := r.tryWrite(wc, b); blocked || err != nil {
			t.Fatalf("tryWrite = blocked %v, %v", blocked, err)
		}
	})
	if allocs != 0 {
		t.Errorf("tryWrite allocates %.1f times per write, want 0: its callback must be bound once (rawWriter.init)", allocs)
	}
}
