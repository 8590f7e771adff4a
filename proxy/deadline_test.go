package proxy_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	pb "github.com/dabbrpc/dabb/examples/inventory/inventorypb"
	"github.com/dabbrpc/dabb/proxy"
)

// frozenPeer accepts connections and never reads from them: a server
// process that is stopped (SIGSTOP, a VM pause) or cut off by a network
// partition. Its connections are closed at cleanup.
func frozenPeer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, nc)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		for _, nc := range conns {
			nc.Close()
		}
		mu.Unlock()
	})
	return l.Addr().String()
}

// TestLargeCallEndsAtItsDeadline: a call's deadline bounds the write of
// its request too. A large request to a peer that stopped reading fills the
// socket buffers; the call still returns at its deadline (it used to wait
// in the write until the heartbeat stall detection closed the connection,
// two intervals later).
func TestLargeCallEndsAtItsDeadline(t *testing.T) {
	addr := frozenPeer(t)
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	const budget = 200 * time.Millisecond
	big := &pb.StockRequest{Sku: strings.Repeat("x", 7<<20)}
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		errc <- c.Invoke(ctx, service, "M", big, new(pb.StockReply), proxy.Timeout(budget), proxy.FailFast())
	}()
	select {
	case err := <-errc:
		if err == nil {
			t.Fatal("a call to a peer that reads nothing succeeded")
		}
		if el := time.Since(start); el > budget+time.Second {
			t.Errorf("the call with a %v budget returned after %v (%v)", budget, el, err)
		}
	case <-time.After(budget + 2*time.Second): // how long the call may take at most: a bound, not a synchronisation
		// Unblock it for cleanup: Close closes the connection.
		c.Close()
		err := <-errc
		t.Fatalf("the call with a %v budget was still blocked %v after it started (writing its request to a peer that stopped reading); ended only by Close: %v",
			budget, time.Since(start).Round(time.Millisecond), err)
	}
}
