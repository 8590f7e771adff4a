package transport

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func TestReadOnlyClearedByFreshDial(t *testing.T) {
	p := newPool(t, Config{ConnsPerAddr: 1})
	addr, l, c := readOnlyAddr(t, p)
	// The old server goes away and a new one takes the address.
	_ = c.Close()
	_ = l.Close()
	serveAgain(t, p, addr, 5*time.Millisecond) // until the old connection is seen closed
	if p.ReadOnly(addr) {
		t.Errorf("ReadOnly still true after a fresh connection")
	}
}

// readOnlyAddr connects p to a fresh listener and has the server's end of
// the connection send the read-only event; it returns once p.ReadOnly
// reports it, with the listener and the server's end.
func readOnlyAddr(t *testing.T, p *Pool) (string, net.Listener, net.Conn) {
	t.Helper()
	l := listen(t)
	addr := l.Addr().String()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := l.Accept()
		if err == nil {
			accepted <- c
		}
		close(accepted)
	}()
	// Connect, with a call whose ctx is cancelled as soon as it is sent.
	ctx, cancel := context.WithCancel(testCtx(t))
	go func() {
		_, _ = p.RoundTrip(ctx, addr, newRequest("connect"))
	}()
	c := waitFor(t, accepted, "the connection")
	if c == nil {
		t.Fatal("accept failed")
	}
	cancel()
	if _, err := c.Write(protocol.AppendReadOnly(nil, 1)); err != nil {
		t.Fatalf("write read-only: %v", err)
	}
	deadline := time.Now().Add(defaultTestTimeout)
	for !p.ReadOnly(addr) {
		if time.Now().After(deadline) {
			t.Fatal("ReadOnly never became true")
		}
		time.Sleep(time.Millisecond) // no hook to await: poll the public API
	}
	return addr, l, c
}

// TestReadOnlyProbeFindsRestartedServer: an address nobody calls (a
// balancer leaves it out while it is read-only) comes back once a server
// restarted there: the pool probes it by itself, and OnBack says so.
// Probes of an address that keeps answering read-only are spaced, however
// often ReadOnly is asked.
func TestReadOnlyProbeFindsRestartedServer(t *testing.T) {
	back := make(chan string, 1)
	p := newPool(t, Config{ConnsPerAddr: 1, OnBack: func(a string) { back <- a }})
	addr, l, c := readOnlyAddr(t, p)
	_ = c.Close()

	// While the old server still accepts and answers every connection
	// with the read-only event, the address stays read-only and probes
	// back off: ~300 ms make a handful of dials (50, 100, 200 ms apart),
	// not hundreds.
	accepted := make(chan net.Conn, 1000)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- nc // closed below: the old server keeps them open
			_, _ = nc.Write(protocol.AppendReadOnly(nil, 1))
		}
	}()
	defer func() {
		for len(accepted) > 0 {
			(<-accepted).Close()
		}
	}()
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		if !p.ReadOnly(addr) {
			t.Fatal("a probe answered with the read-only event cleared the mark")
		}
		time.Sleep(100 * time.Microsecond) // a balancer asking at its call rate
	}
	if n := len(accepted); n < 1 || n > 6 {
		t.Errorf("%d probe dials in 300 ms while the server answered read-only; want 1 to 6", n)
	}

	_ = l.Close()
	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	startServerOn(t, l2, echo, ServerConfig{})
	if got := waitFor(t, back, "OnBack, with no call sent and ReadOnly not asked"); got != addr {
		t.Errorf("OnBack(%q), want %q", got, addr)
	}
	if p.ReadOnly(addr) {
		t.Error("ReadOnly still true after OnBack")
	}
	resp, err := p.RoundTrip(testCtx(t), addr, newRequest("again"))
	if err != nil {
		t.Fatalf("RoundTrip to the restarted address: %v", err)
	}
	p.Release(resp)
}

// TestCloseDuringProbe: a probe waiting for a heartbeat answer that never
// comes does not hold Pool.Close for the dial timeout.
func TestCloseDuringProbe(t *testing.T) {
	p := NewPool(Config{ConnsPerAddr: 1, DialTimeout: time.Minute, Logger: quietLogger()})
	addr, l, c := readOnlyAddr(t, p)
	accepted := make(chan net.Conn, 4)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- nc // a server that accepts and never answers
		}
	}()
	_ = c.Close() // the pool probes once it sees the old connection closed
	probe := waitFor(t, accepted, "the probe dial")
	if probe == nil {
		t.Fatal("accept failed")
	}
	defer probe.Close()
	if !p.ReadOnly(addr) {
		t.Error("ReadOnly = false while the probe waits for its answer")
	}
	start := time.Now()
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("Close took %v with a probe waiting for its heartbeat answer", d)
	}
	_ = l.Close()
	for nc := range accepted {
		nc.Close()
	}
}

// TestProbeRefusesAStrangeAnswer: a probe whose heartbeat is answered by
// something else than a heartbeat response (here a call's response, from
// a server speaking the protocol wrongly) does not clear the read-only
// mark.
func TestProbeRefusesAStrangeAnswer(t *testing.T) {
	p := newPool(t, Config{ConnsPerAddr: 1})
	addr, l, c := readOnlyAddr(t, p)
	_ = c.Close()
	accepted := make(chan net.Conn, 100)
	go func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				close(accepted)
				return
			}
			accepted <- nc
			var resp protocol.Message
			resp.Header.Init(protocol.MakeFlags(0, 22), protocol.StatusOK, 1)
			_, _ = nc.Write(protocol.AppendMessage(nil, &resp))
		}
	}()
	// Watch until a probe was answered and, with backoff, a second began.
	deadline := time.Now().Add(defaultTestTimeout)
	for len(accepted) < 2 {
		if !p.ReadOnly(addr) {
			t.Fatal("a probe answered with a call's response cleared the read-only mark")
		}
		if time.Now().After(deadline) {
			t.Fatal("no second probe came")
		}
		time.Sleep(time.Millisecond) // a balancer asking at its call rate
	}
	if !p.ReadOnly(addr) {
		t.Fatal("a probe answered with a call's response cleared the read-only mark")
	}
	_ = l.Close()
	for nc := range accepted {
		nc.Close()
	}
}
