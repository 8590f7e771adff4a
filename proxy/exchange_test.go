package proxy_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/codec"
	cproto "github.com/dabbrpc/dabb/codec/proto"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/transport"
)

func TestBadReply(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, garbage, transport.ServerConfig{})
	c := client(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := invoke(ctx, c)
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Status != protocol.StatusBadResponse || pe.Remote || !errors.Is(err, proxy.ErrBadRequest) {
		t.Fatalf("got %v, want a local status 50", err)
	}
	if !strings.Contains(pe.Msg, "decode test.Svc.M reply") {
		t.Fatalf("message %q does not name the method", pe.Msg)
	}
}

// slowCodec is the protobuf codec with a Marshal that takes marshalDelay
// and pads its output to 64 KiB (the test server does not decode
// requests): a large request whose encoding takes part of the budget.
type slowCodec struct{ cproto.Codec }

const marshalDelay = 300 * time.Millisecond

func (slowCodec) ID() byte { return 29 }

func (slowCodec) Name() string { return "slow-test" }

func (c slowCodec) Marshal(dst []byte, v any) ([]byte, error) {
	time.Sleep(marshalDelay)
	b, err := c.Codec.Marshal(dst, v)
	return append(b, make([]byte, 64<<10)...), err
}

func init() { codec.Register(slowCodec{}) }

// TestBudgetLeftAfterMarshal: what travels with a large request is the
// budget left after encoding it, not the budget at the attempt's start.
func TestBudgetLeftAfterMarshal(t *testing.T) {
	s := &seen{}
	addr := serve(t, s, 0, transport.ServerConfig{})
	c := client(t, []string{addr}, proxy.WithCodec("slow-test"), proxy.WithTimeout(time.Second))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); err != nil {
		t.Fatal(err)
	}
	s.mu.Lock()
	got := s.budget
	s.mu.Unlock()
	if want := time.Second - marshalDelay; got > want {
		t.Errorf("the server saw a budget of %v after a %v marshal of a 1 s call, want at most %v", got, marshalDelay, want)
	}
}

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
