// Tests of the BodyBudget: partial large bodies from many connections.

package transport

import (
	"bufio"
	"encoding/binary"
	"net"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// heartbeatRTT returns the median of n heartbeat round trips on c.
func heartbeatRTT(t *testing.T, c net.Conn, rd *protocol.Reader, firstID uint64, n int) time.Duration {
	t.Helper()
	rtts := make([]time.Duration, n)
	for i := range rtts {
		start := time.Now()
		heartbeat(t, c, rd, firstID+uint64(i))
		rtts[i] = time.Since(start)
	}
	slices.Sort(rtts)
	return rtts[n/2]
}

// heapInuse returns the heap in use after the garbage and the pooled
// buffers are collected (a sync.Pool empties over two cycles).
func heapInuse() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse
}

// serverReads sums the socket reads of the server's connections.
func serverReads(s *Server) uint64 {
	var n uint64
	for _, sc := range s.openConns() {
		n += sc.live.reads.Load()
	}
	return n
}

// TestPartialBodyFlood: 16 connections each claim an 8 MiB body and send
// 4 MiB of it. The server holds no more than its BodyBudget for them, and
// a heartbeat on another connection keeps its round trip.
func TestPartialBodyFlood(t *testing.T) {
	const (
		attackers = 16
		claimed   = 8 << 20
		sent      = 4 << 20
		budget    = 32 << 20
		rounds    = 200
	)
	ts := startServer(t, echo, ServerConfig{BodyBudget: budget})
	hb := dialRaw(t, ts.addr)
	rd := protocol.NewReader(bufio.NewReader(hb), 0)
	heartbeat(t, hb, rd, 1) // warm up
	baseline := heartbeatRTT(t, hb, rd, 100, rounds)
	// A median on a busy machine moves by a millisecond on its own.
	bound := max(2*baseline, baseline+time.Millisecond)

	body := make([]byte, sent) // shared by every attacker, read only
	var head protocol.Header
	head.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 7)
	head.SetMagic()
	binary.BigEndian.PutUint32(head[12:16], claimed)
	before := heapInuse()

	var writers sync.WaitGroup
	conns := make([]net.Conn, attackers)
	for i := range conns {
		conns[i] = dialRaw(t, ts.addr)
		c := conns[i]
		writers.Go(func() {
			// Blocks while the server does not read; the cleanup's
			// Close ends it.
			if _, err := c.Write(head[:]); err == nil {
				_, _ = c.Write(body)
			}
		})
	}
	t.Cleanup(func() {
		for _, c := range conns {
			_ = c.Close()
		}
		writers.Wait()
	})

	during := heartbeatRTT(t, hb, rd, 1000, rounds)

	// The server reads what its budget lets it, then stops.
	// No change in 100 ms is taken for stopped.
	last, changed := serverReads(ts.srv), time.Now()
	eventually(t, "the server to stop reading the attacking connections", func() bool {
		if n := serverReads(ts.srv); n != last {
			last, changed = n, time.Now()
		}
		return time.Since(changed) >= 100*time.Millisecond
	})
	growth := int64(heapInuse()) - int64(before)
	held := heartbeatRTT(t, hb, rd, 10000, rounds)

	t.Logf("heartbeat median: %v before, %v during the flood, %v with it held; heap growth %d MiB",
		baseline, during, held, growth>>20)
	if limit := int64(budget + 16<<20); growth > limit {
		t.Errorf("server heap grew %d MiB under the flood, want at most the budget + 16 MiB (%d MiB)",
			growth>>20, limit>>20)
	}
	if during > bound || held > bound {
		t.Errorf("heartbeat median %v during the flood, %v with it held; want at most %v (baseline %v)",
			during, held, bound, baseline)
	}

	// A small call on its own connection still runs.
	p := newPool(t, Config{})
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("small"))
	if err != nil {
		t.Fatalf("small call during the flood: %v", err)
	}
	if string(resp.Payload) != "small" {
		t.Errorf("payload = %q", resp.Payload)
	}
	p.Release(resp)
}
