package transport

import (
	"bytes"
	"context"
	"io"
	"net"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func TestWriterStallDetection(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	var w frameWriter
	w.init(c, func(error) {})
	if w.state() != writeQuiet {
		t.Fatalf("an idle writer reported %v", w.state())
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.writeMessage(frameOf("stuck"), limit{})
		done <- err
	}()
	waitFor(t, c.entered, "the write")
	var l liveness
	l.reads.Add(1) // reads keep coming: only the write is stuck
	actions := []tickAction{}
	for range stuckTicks {
		l.reads.Add(1)
		actions = append(actions, l.tick(w.state()))
	}
	if actions[len(actions)-1] != tickStalled {
		t.Errorf("ticks over a stuck write gave %v, want the last to be tickStalled", actions)
	}
	close(c.gate)
	<-done
	if s := w.state(); s != writeQuiet {
		t.Errorf("state %v after the write completed", s)
	}
}

func TestLivenessSilence(t *testing.T) {
	var l liveness
	want := []tickAction{tickHeartbeat, tickHeartbeat, tickSilent}
	for i, a := range want {
		if got := l.tick(writeQuiet); got != a {
			t.Fatalf("silent tick %d = %v, want %v", i+1, got, a)
		}
	}
	l = liveness{}
	l.tick(writeQuiet)
	l.reads.Add(1)
	if got := l.tick(writeQuiet); got != tickNothing {
		t.Errorf("tick after a read = %v, want tickNothing", got)
	}
	if got := l.tick(writeQuiet); got != tickHeartbeat {
		t.Errorf("tick after a quiet interval = %v, want tickHeartbeat", got)
	}
}

// TestSlowPeerIsNotAStall: a large frame written to a peer that reads it
// slowly, and sends nothing, takes many heartbeat ticks and is taken
// neither for a stall nor for silence; once the peer stops reading, it is
// a stall within a few ticks.
func TestSlowPeerIsNotAStall(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the peer's acknowledgements are read on Linux only")
	}
	wc, rc := tcpPair(t)
	var w frameWriter
	w.init(wc, func(error) {})
	const size = 4 << 20
	const tick = 100 * time.Millisecond
	done := make(chan error, 1)
	go func() {
		_, err := w.writeMessage(newRequest(string(bytes.Repeat([]byte{'x'}, size))), limit{})
		done <- err
	}()

	// The peer reads 16 KiB every 5 ms (~3 MB/s) and the connection
	// ticks every 100 ms: half the frame takes ~6 ticks, past stuckTicks.
	var l liveness
	buf := make([]byte, 16<<10)
	read, ticks := 0, 0
	next := time.Now().Add(tick)
	for read < size/2 {
		n, err := rc.Read(buf)
		if err != nil {
			t.Fatalf("peer read: %v", err)
		}
		read += n
		time.Sleep(5 * time.Millisecond) // the slow peer's pace
		if time.Now().After(next) {
			next = next.Add(tick)
			ticks++
			// The peer sends nothing meanwhile: the acknowledged frame
			// is the only sign of life, and it is enough.
			if a := l.tick(w.state()); a == tickStalled || a == tickSilent {
				t.Fatalf("a frame the peer was reading (%d of %d bytes after %d ticks) gave tick action %v", read, size, ticks, a)
			}
		}
	}
	if ticks <= stuckTicks {
		t.Fatalf("the write lasted only %d ticks; the test needs more than %d", ticks, stuckTicks)
	}

	// The peer stops reading: once the buffers are full nothing is
	// acknowledged, and the ticks see a stall.
	stalled := false
	for i := 0; i < stuckTicks+10 && !stalled; i++ {
		time.Sleep(tick)
		stalled = l.tick(w.state()) == tickStalled
	}
	if !stalled {
		t.Fatalf("a peer that stopped reading was not seen as a stall within %d ticks", stuckTicks+10)
	}
	go func() { _, _ = io.Copy(io.Discard, rc) }()
	if err := waitFor(t, done, "the large write to finish"); err != nil {
		t.Fatalf("write: %v", err)
	}
}

// slowConn reads at most 16 KiB every 5 ms (~3 MB/s): a slow link as its
// reader sees it.
type slowConn struct{ net.Conn }

func (c slowConn) Read(p []byte) (int, error) {
	time.Sleep(5 * time.Millisecond) // the link's pace
	return c.Conn.Read(p[:min(len(p), 16<<10)])
}

// smallBuffers listens with linkBuffer-sized socket buffers on the accepted
// connections; with slow, their reads go through slowConn.
type smallBuffers struct {
	net.Listener
	slow bool
}

func (l smallBuffers) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc := c.(*net.TCPConn)
	_ = tc.SetReadBuffer(linkBuffer)
	_ = tc.SetWriteBuffer(linkBuffer)
	if l.slow {
		return slowConn{c}, nil
	}
	return c, nil
}

// A large frame over a slow link takes ~7 heartbeat intervals; the side
// reading it has nothing to send meanwhile. The socket buffers hold a
// small part of it (but more than loopback's 64 KiB segment, which a
// smaller window would hold back). What they hold once the writer's last
// write returned (Linux doubles the sizes set: ~512 KiB for the two) must
// be read well within the three intervals a peer has to answer a
// heartbeat; at 256 KiB each it took about two, and the test failed now
// and then under load.
const (
	slowLinkInterval = 150 * time.Millisecond
	slowLinkSize     = 4 << 20
	linkBuffer       = 128 << 10
)

// slowLinkPool dials with small socket buffers, reading through slowConn
// when slow.
func slowLinkPool(t *testing.T, slow bool) *Pool {
	var d net.Dialer
	return newPool(t, Config{
		HeartbeatInterval: slowLinkInterval,
		Dial: func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, "tcp", addr)
			if err != nil {
				return nil, err
			}
			tc := c.(*net.TCPConn)
			_ = tc.SetReadBuffer(linkBuffer)
			_ = tc.SetWriteBuffer(linkBuffer)
			if slow {
				return slowConn{c}, nil
			}
			return c, nil
		},
	})
}

// TestSlowLinkLargeRequest: a large request the server keeps reading over
// a slow link is neither a stall nor silence to the client, although
// nothing comes back until it is all read.
func TestSlowLinkLargeRequest(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the peer's acknowledgements are read on Linux only")
	}
	ok := HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		resp.Payload = append(resp.Payload[:0], "ok"...)
	})
	ts := startServerOn(t, smallBuffers{listen(t), true}, ok, ServerConfig{HeartbeatInterval: slowLinkInterval})
	p := slowLinkPool(t, false)
	start := time.Now()
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest(strings.Repeat("x", slowLinkSize)))
	if err != nil {
		t.Fatalf("a large request the server kept reading failed after %v (%d heartbeat intervals): %v",
			time.Since(start).Round(time.Millisecond), time.Since(start)/slowLinkInterval, err)
	}
	p.Release(resp)
}

// TestSlowLinkLargeResponse: the same for a large response the client
// keeps reading, as the server sees it.
func TestSlowLinkLargeResponse(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("the peer's acknowledgements are read on Linux only")
	}
	big := HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		resp.Payload = append(resp.Payload[:0], strings.Repeat("y", slowLinkSize)...)
	})
	ts := startServerOn(t, smallBuffers{listen(t), false}, big, ServerConfig{HeartbeatInterval: slowLinkInterval})
	p := slowLinkPool(t, true)
	start := time.Now()
	resp, err := p.RoundTrip(testCtx(t), ts.addr, newRequest("a lot, please"))
	if err != nil {
		t.Fatalf("a large response the client kept reading failed after %v (%d server heartbeat intervals): %v",
			time.Since(start).Round(time.Millisecond), time.Since(start)/slowLinkInterval, err)
	}
	p.Release(resp)
}
