package transport

import (
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// acceptCounter counts accepted connections.
type acceptCounter struct {
	net.Listener
	accepted atomic.Int64
}

func (l *acceptCounter) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.accepted.Add(1)
	}
	return c, err
}

// TestLargeRequestsUseTheirOwnConnection: a request at or over
// LargeMessage goes over a connection of its own, so it never queues in
// front of small calls; with LargeMessage negative it shares theirs.
func TestLargeRequestsUseTheirOwnConnection(t *testing.T) {
	for _, tt := range []struct {
		name  string
		large int
		want  int64 // connections accepted in the end
	}{
		{"own connection", 1 << 10, 3},
		{"shared", -1, 2},
	} {
		t.Run(tt.name, func(t *testing.T) {
			l := &acceptCounter{Listener: listen(t)}
			ts := startServerOn(t, l, echo, ServerConfig{})
			p := newPool(t, Config{ConnsPerAddr: 2, LargeMessage: tt.large})
			ctx := testCtx(t)
			for range 4 { // both shared connections get dialed
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest("small"))
				if err != nil {
					t.Fatal(err)
				}
				p.Release(resp)
			}
			big := strings.Repeat("x", 2<<10)
			large := func() {
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest(big))
				if err != nil {
					t.Fatal(err)
				}
				if string(resp.Payload) != big {
					t.Fatalf("large echo came back with %d bytes", len(resp.Payload))
				}
				p.Release(resp)
			}
			// One dial per address is in flight at a time, and a call
			// uses another live connection meanwhile: keep calling until
			// the dials are done, bounded by the test's timeout.
			for range 3 {
				large()
			}
			for l.accepted.Load() < tt.want && ctx.Err() == nil {
				large()
				time.Sleep(time.Millisecond)
			}
			for range 20 { // more of both: no further connection
				large()
				resp, err := p.RoundTrip(ctx, ts.addr, newRequest("small"))
				if err != nil {
					t.Fatal(err)
				}
				p.Release(resp)
			}
			if got := l.accepted.Load(); got != tt.want {
				t.Fatalf("server accepted %d connections, want %d", got, tt.want)
			}
		})
	}
}
