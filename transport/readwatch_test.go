// Tests of the read timeouts, over loopback TCP.

package transport

import (
	"bufio"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// heartbeat does one heartbeat round trip on c, skipping the server's own
// events, with a bounded wait.
func heartbeat(t *testing.T, c net.Conn, rd *protocol.Reader, id uint64) {
	t.Helper()
	if _, err := c.Write(protocol.AppendHeartbeat(nil, id)); err != nil {
		t.Fatalf("write heartbeat %d: %v", id, err)
	}
	for {
		m := readResponse(t, rd, c)
		if m.IsHeartbeatResponse() && m.Header.ID() == id {
			return
		}
	}
}

// closedWithin waits until the server closes c and returns how long after
// from that was seen. It fails the test if c is still open after limit.
func closedWithin(t *testing.T, c net.Conn, from time.Time, limit time.Duration) time.Duration {
	t.Helper()
	_ = c.SetReadDeadline(from.Add(limit))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		t.Fatalf("connection still open %v after its last byte", limit)
	}
	return time.Since(from)
}

// halfHeader is the first 8 bytes of a heartbeat's header.
var halfHeader = protocol.AppendHeartbeat(nil, 1)[:8]

func TestFrameReadTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	cfg := ServerConfig{FrameReadTimeout: timeout, FirstFrameTimeout: time.Minute}

	t.Run("1000 half headers are closed on time", func(t *testing.T) {
		ts := startServer(t, echo, cfg)
		const n = 1000
		conns := make([]net.Conn, n)
		sent := make([]time.Time, n)
		for i := range conns {
			conns[i] = dialRaw(t, ts.addr)
			if _, err := conns[i].Write(halfHeader); err != nil {
				t.Fatalf("conn %d: write: %v", i, err)
			}
			sent[i] = time.Now()
		}
		// A connection that sends whole frames is not touched.
		good := dialRaw(t, ts.addr)
		rd := protocol.NewReader(bufio.NewReader(good), 0)
		heartbeat(t, good, rd, 1)
		var worst time.Duration
		for i, c := range conns {
			d := closedWithin(t, c, sent[i], 2*time.Second)
			if d < timeout {
				t.Fatalf("conn %d closed %v after its half header, before FrameReadTimeout %v", i, d, timeout)
			}
			worst = max(worst, d)
		}
		t.Logf("slowest close: %v after the half header (timeout %v)", worst, timeout)
		heartbeat(t, good, rd, 2)
	})

	t.Run("a body cut short after a valid frame", func(t *testing.T) {
		ts := startServer(t, echo, cfg)
		c := dialRaw(t, ts.addr)
		rd := protocol.NewReader(bufio.NewReader(c), 0)
		heartbeat(t, c, rd, 1)
		frame := protocol.AppendMessage(nil, newRequest(strings.Repeat("x", 1000)))
		if _, err := c.Write(frame[:len(frame)/2]); err != nil {
			t.Fatal(err)
		}
		sent := time.Now()
		if d := closedWithin(t, c, sent, 5*time.Second); d < timeout {
			t.Fatalf("closed %v after the half body, before FrameReadTimeout %v", d, timeout)
		}
	})

	t.Run("an idle connection between frames stays", func(t *testing.T) {
		ts := startServer(t, echo, cfg)
		c := dialRaw(t, ts.addr)
		rd := protocol.NewReader(bufio.NewReader(c), 0)
		heartbeat(t, c, rd, 1)
		// A stalled one shows when the watch has had time to act.
		probe := dialRaw(t, ts.addr)
		if _, err := probe.Write(halfHeader); err != nil {
			t.Fatal(err)
		}
		closedWithin(t, probe, time.Now(), 5*time.Second)
		heartbeat(t, c, rd, 2)
	})
}

func TestFirstFrameTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	ts := startServer(t, echo, ServerConfig{FirstFrameTimeout: timeout})
	silent := dialRaw(t, ts.addr)
	opened := time.Now()
	talker := dialRaw(t, ts.addr)
	rd := protocol.NewReader(bufio.NewReader(talker), 0)
	heartbeat(t, talker, rd, 1)

	if d := closedWithin(t, silent, opened, 5*time.Second); d < timeout {
		t.Fatalf("silent connection closed after %v, before FirstFrameTimeout %v", d, timeout)
	}
	// The talker has been open as long: one valid frame keeps it.
	heartbeat(t, talker, rd, 2)
}
