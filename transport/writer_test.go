package transport

import (
	"bufio"
	"bytes"
	"errors"
	"net"
	"sync"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// gateConn records writes; the first Write blocks until gate is closed.
type gateConn struct {
	net.Conn
	gate    chan struct{}
	entered chan struct{}
	mu      sync.Mutex
	writes  [][]byte
	fail    error
}

func (c *gateConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	first := len(c.writes) == 0
	c.writes = append(c.writes, bytes.Clone(p))
	fail := c.fail
	c.mu.Unlock()
	if first {
		close(c.entered)
		<-c.gate
	}
	if fail != nil {
		return 0, fail
	}
	return len(p), nil
}

func frameOf(payload string) *protocol.Message {
	m := newRequest(payload)
	m.Header.SetID(uint64(len(payload)))
	return m
}

func TestWriterCoalesces(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	var w frameWriter
	w.init(c, func(err error) { t.Errorf("unexpected write error: %v", err) })

	done := make(chan error, 1)
	go func() {
		_, err := w.writeMessage(frameOf("first")) // becomes the flusher, blocks
		done <- err
	}()
	waitFor(t, c.entered, "the first write")
	// A flusher is active: these return at once, their frames queued.
	for _, p := range []string{"a", "bb", "ccc"} {
		if queued, err := w.writeMessage(frameOf(p)); !queued || err != nil {
			t.Fatalf("writeMessage while flushing = %v, %v", queued, err)
		}
	}
	if err := w.writeEvent(eventHeartbeat, 9); err != nil {
		t.Fatalf("writeEvent: %v", err)
	}
	close(c.gate)
	if err := waitFor(t, done, "the flusher"); err != nil {
		t.Fatalf("flusher: %v", err)
	}
	if !w.idle() {
		t.Errorf("writer not idle after the flush")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.writes) != 2 {
		t.Fatalf("%d writes, want 2 (the first frame, then the rest coalesced)", len(c.writes))
	}
	rd := protocol.NewReader(bufio.NewReader(bytes.NewReader(c.writes[1])), 0)
	var got []string
	for {
		var m protocol.Message
		if err := rd.Read(&m); err != nil {
			break
		}
		if m.IsHeartbeat() {
			got = append(got, "heartbeat")
			continue
		}
		got = append(got, string(m.Payload))
	}
	want := []string{"a", "bb", "ccc", "heartbeat"}
	if len(got) != len(want) {
		t.Fatalf("second write held %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("second write held %v, want %v", got, want)
		}
	}
}

func TestWriterErrors(t *testing.T) {
	boom := errors.New("boom")
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{}), fail: boom}
	close(c.gate)
	var failed []error
	var w frameWriter
	w.init(c, func(err error) { failed = append(failed, err) })

	queued, err := w.writeMessage(frameOf("x"))
	if !queued || !errors.Is(err, boom) {
		t.Fatalf("failing write = %v, %v; want queued with the write error", queued, err)
	}
	if len(failed) != 1 {
		t.Fatalf("onError called %d times, want 1", len(failed))
	}
	// Sticky: later frames are refused before they are queued.
	queued, err = w.writeMessage(frameOf("y"))
	if queued || !errors.Is(err, boom) {
		t.Fatalf("write after failure = %v, %v; want not queued", queued, err)
	}
	if err := w.writeEvent(eventReadOnly, 1); !errors.Is(err, boom) {
		t.Fatalf("writeEvent after failure = %v", err)
	}

	var w2 frameWriter
	w2.init(c, func(error) {})
	w2.fail(ErrClosed)
	if queued, err := w2.writeMessage(frameOf("z")); queued || !errors.Is(err, ErrClosed) {
		t.Fatalf("write after fail(ErrClosed) = %v, %v", queued, err)
	}
}

func TestWriterStallDetection(t *testing.T) {
	c := &gateConn{gate: make(chan struct{}), entered: make(chan struct{})}
	var w frameWriter
	w.init(c, func(error) {})
	if w.stalled() {
		t.Fatalf("an idle writer reported stalled")
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.writeMessage(frameOf("stuck"))
		done <- err
	}()
	waitFor(t, c.entered, "the write")
	var l liveness
	l.reads.Add(1) // reads keep coming: only the write is stuck
	actions := []tickAction{}
	for range stuckTicks {
		l.reads.Add(1)
		actions = append(actions, l.tick(w.stalled()))
	}
	if actions[len(actions)-1] != tickStalled {
		t.Errorf("ticks over a stuck write gave %v, want the last to be tickStalled", actions)
	}
	close(c.gate)
	<-done
	if w.stalled() {
		t.Errorf("stalled after the write completed")
	}
}

func TestLivenessSilence(t *testing.T) {
	var l liveness
	want := []tickAction{tickHeartbeat, tickHeartbeat, tickSilent}
	for i, a := range want {
		if got := l.tick(false); got != a {
			t.Fatalf("silent tick %d = %v, want %v", i+1, got, a)
		}
	}
	l = liveness{}
	l.tick(false)
	l.reads.Add(1)
	if got := l.tick(false); got != tickNothing {
		t.Errorf("tick after a read = %v, want tickNothing", got)
	}
	if got := l.tick(false); got != tickHeartbeat {
		t.Errorf("tick after a quiet interval = %v, want tickHeartbeat", got)
	}
}
