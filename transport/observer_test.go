// Tests of the ServerObserver: the rejections and connections a server reports.

package transport

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// countingObserver counts what a server reports. It allocates nothing.
type countingObserver struct {
	overload, shutdown, budget, bad, unimplemented atomic.Int64
	maxConns, goneAway                             atomic.Int64
	opened, closed                                 atomic.Int64
}

func (o *countingObserver) Rejected(r Rejection) {
	switch r {
	case RejectOverload:
		o.overload.Add(1)
	case RejectShutdown:
		o.shutdown.Add(1)
	case RejectBudgetSpent:
		o.budget.Add(1)
	case RejectBadRequest:
		o.bad.Add(1)
	case RejectUnimplemented:
		o.unimplemented.Add(1)
	case RejectMaxConns:
		o.maxConns.Add(1)
	case RejectGoneAway:
		o.goneAway.Add(1)
	}
}

func (o *countingObserver) ConnOpened() { o.opened.Add(1) }
func (o *countingObserver) ConnClosed() { o.closed.Add(1) }

// TestServerObserver: each refusal before the handler is reported once
// with its reason, and each connection opened is reported closed.
func TestServerObserver(t *testing.T) {
	obs := &countingObserver{}
	bs := startBlockingServer(t, ServerConfig{MaxConcurrent: 1, MaxBody: 64, Observer: obs})
	p := newPool(t, Config{ConnsPerAddr: 1})
	c := dialRaw(t, bs.addr)
	rd := protocol.NewReader(bufio.NewReader(c), 0)
	twoWay := protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22)

	// Two bad requests: a body that does not decode, one over MaxBody.
	for i, body := range [][]byte{{0x7f, 'a'}, make([]byte, 100)} {
		if _, err := c.Write(rawFrame(uint64(10+i), twoWay, body)); err != nil {
			t.Fatalf("write: %v", err)
		}
		if m := readResponse(t, rd, c); m.Header.Status() != protocol.StatusBadRequest {
			t.Fatalf("bad frame %d: status %v, want 40", i, m.Header.Status())
		}
	}
	late := newRequest("late")
	late.Timeout = -1
	_, err := p.RoundTrip(testCtx(t), bs.addr, late)
	wantStatus(t, err, protocol.StatusServerTimeout, true, false)

	blocked := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(context.Background(), bs.addr, newRequest("block"))
		if err == nil {
			p.Release(resp)
		}
		blocked <- err
	}()
	waitFor(t, bs.entered, "the handler to take the only slot")
	_, err = p.RoundTrip(testCtx(t), bs.addr, newRequest("one too many"))
	wantStatus(t, err, protocol.StatusServerThreadpoolExhausted, true, false)
	close(bs.release)
	if err := waitFor(t, blocked, "the blocked call"); err != nil {
		t.Fatalf("blocked call: %v", err)
	}
	// Closed now: after the read-only event it would probe the address
	// with connections of its own.
	_ = p.Close()

	shut := startShutdown(t, bs.srv)
	if m := readResponse(t, rd, c); !m.IsReadOnly() {
		t.Fatalf("got flags %#x, want the read-only event", byte(m.Header.Flags()))
	}
	req := newRequest("after read-only")
	req.Header.SetID(20)
	if _, err := c.Write(protocol.AppendMessage(nil, req)); err != nil {
		t.Fatalf("write: %v", err)
	}
	if m := readResponse(t, rd, c); m.Header.Status() != protocol.StatusServerThreadpoolExhausted {
		t.Fatalf("status %v during shutdown, want 100", m.Header.Status())
	}
	_ = c.Close()
	if err := waitFor(t, shut, "Shutdown"); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}

	for _, tc := range []struct {
		what string
		got  *atomic.Int64
		want int64
	}{
		{"bad_request", &obs.bad, 2},
		{"budget_spent", &obs.budget, 1},
		{"overload", &obs.overload, 1},
		{"shutdown", &obs.shutdown, 1},
		{"unimplemented", &obs.unimplemented, 0},
		{"connections opened", &obs.opened, 2},
		{"connections closed", &obs.closed, 2},
	} {
		if n := tc.got.Load(); n != tc.want {
			t.Errorf("%s: %d reported, want %d", tc.what, n, tc.want)
		}
	}
}

// TestObserverHookAllocs: a refused request costs no allocation, with no
// observer and with one that allocates nothing itself. The hook is off
// the path of a served request altogether.
func TestObserverHookAllocs(t *testing.T) {
	l := listen(t)
	defer l.Close()
	client, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	drained := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, client); close(drained) }()

	for _, tc := range []struct {
		name string
		obs  ServerObserver
	}{{"no observer", nil}, {"observer", &countingObserver{}}} {
		t.Run(tc.name, func(t *testing.T) {
			s := NewServer(echo, ServerConfig{Logger: quietLogger(), Observer: tc.obs})
			defer s.Close()
			sc := newServerConn(s, server)
			reject := func() {
				call := serverCallPool.Get().(*serverCall)
				call.req.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, 1)
				call.req.Timeout = -1 // spent: answered 31 at once
				sc.dispatch(call, false)
			}
			reject()
			if n := testing.AllocsPerRun(1000, reject); n != 0 {
				t.Errorf("a refused request allocates %v times, want 0", n)
			}
			if o, ok := tc.obs.(*countingObserver); ok && o.budget.Load() != 1002 {
				t.Errorf("observer counted %d refusals, want 1002", o.budget.Load())
			}
		})
	}
	_ = server.Close()
	<-drained
}
