// Tests of the read timeouts and of MaxConns, over loopback TCP.

package transport

import (
	"bufio"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
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

func TestMaxConns(t *testing.T) {
	var logs lockedBuffer
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	const limit = 3
	ts := startServer(t, echo, ServerConfig{MaxConns: limit, Logger: log})
	held := make([]net.Conn, limit)
	for i := range held {
		held[i] = dialRaw(t, ts.addr)
		heartbeat(t, held[i], protocol.NewReader(bufio.NewReader(held[i]), 0), 1)
	}

	start := time.Now()
	const surplus = 5
	var wg sync.WaitGroup
	for i := range surplus {
		c := dialRaw(t, ts.addr)
		wg.Go(func() {
			if d := closedWithin(t, c, time.Now(), 5*time.Second); d > time.Second {
				t.Errorf("surplus conn %d closed after %v, want at once", i, d)
			}
		})
	}
	wg.Wait()
	lines := strings.Count(logs.String(), "too many connections")
	if lines < 1 || (time.Since(start) < time.Second && lines != 1) {
		t.Errorf("%d log lines for %d surplus connections within %v, want 1:\n%s",
			lines, surplus, time.Since(start), logs.String())
	}

	// A freed place takes a new connection.
	_ = held[0].Close()
	eventually(t, "the server to forget a closed connection", func() bool { return ts.srv.nconns.Load() < limit })
	c := dialRaw(t, ts.addr)
	heartbeat(t, c, protocol.NewReader(bufio.NewReader(c), 0), 1)
	for _, c := range held[1:] {
		heartbeat(t, c, protocol.NewReader(bufio.NewReader(c), 0), 2)
	}
}

// MaxConns holds over all of a server's listeners: of connections racing
// in through two of them, MaxConns are served and the others closed.
func TestMaxConnsOverListeners(t *testing.T) {
	const limit, dials = 4, 40
	srv := NewServer(echo, ServerConfig{MaxConns: limit, Logger: quietLogger()})
	var addrs []string
	served := make(chan error, 2)
	for range 2 {
		l := listen(t)
		addrs = append(addrs, l.Addr().String())
		go func() { served <- srv.Serve(l) }()
	}
	t.Cleanup(func() {
		_ = srv.Close()
		for range 2 {
			if err := waitFor(t, served, "Serve to return"); !errors.Is(err, ErrServerClosed) {
				t.Errorf("Serve returned %v, want ErrServerClosed", err)
			}
		}
	})
	var wg sync.WaitGroup
	var held atomic.Int32
	for i := range dials {
		c := dialRaw(t, addrs[i%2])
		wg.Go(func() {
			// A served connection answers a heartbeat; a refused one is
			// closed before it reads it.
			if _, err := c.Write(protocol.AppendHeartbeat(nil, 1)); err != nil {
				return
			}
			_ = c.SetReadDeadline(time.Now().Add(defaultTestTimeout))
			m := new(protocol.Message)
			err := protocol.NewReader(bufio.NewReader(c), 0).Read(m)
			switch {
			case err == nil && m.IsHeartbeatResponse():
				held.Add(1)
			case err == nil:
				t.Errorf("connection %d: got a frame that is no heartbeat response", i)
			case errors.Is(err, os.ErrDeadlineExceeded):
				t.Errorf("connection %d: neither answered nor closed within %v", i, defaultTestTimeout)
			}
		})
	}
	wg.Wait()
	if n := held.Load(); n != limit {
		t.Errorf("%d connections served, want MaxConns (%d)", n, limit)
	}
	if n := srv.nconns.Load(); n != limit {
		t.Errorf("the server counts %d connections, want %d", n, limit)
	}
}
