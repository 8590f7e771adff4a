// Tests of the read buffers idle connections lend.

package transport

import (
	"bufio"
	"context"
	"net"
	"runtime"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/protocol"
)

// TestIdleConnectionsHoldNoReadBuffer: once the server holds more than
// lendFrom connections, a connection waiting for its next frame lends its
// 16 KiB read buffer back, so that 200 more idle connections, client and
// server sides together, weigh under 10 KiB of heap each.
func TestIdleConnectionsHoldNoReadBuffer(t *testing.T) {
	ts := startServer(t, HandlerFunc(func(context.Context, *protocol.Message, *protocol.Message) {}), ServerConfig{})
	const n = 200
	heap := func() uint64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return ms.HeapAlloc
	}
	open := func(n int) []net.Conn {
		conns := make([]net.Conn, n)
		for i := range conns {
			conns[i] = dialRaw(t, ts.addr)
			heartbeat(t, conns[i], protocol.NewReader(bufio.NewReaderSize(conns[i], 64), protocol.DefaultMaxBody), 1)
		}
		return conns
	}
	// The first lendFrom keep their buffers while they wait.
	first := open(lendFrom)
	before := heap()
	conns := open(n)
	var per uint64
	wait.Until(t, 5*time.Second, 10*time.Millisecond, "idle connections under 10 KiB of heap each", func() bool {
		h := heap()
		per = (h - min(before, h)) / n
		return per < 10<<10
	})
	t.Logf("%d idle connections: %d B of heap each, both sides", n, per)
	runtime.KeepAlive(first)
	runtime.KeepAlive(conns)
}
