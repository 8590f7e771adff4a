package proxy_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	gproto "google.golang.org/protobuf/proto"

	"github.com/dabbrpc/dabb/codec"
	cproto "github.com/dabbrpc/dabb/codec/proto"
	pb "github.com/dabbrpc/dabb/examples/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

// slowCodec is the protobuf codec with a Marshal that takes marshalDelay
// and pads its output to 64 KiB (the test server does not decode
// requests): a large request whose encoding takes part of the budget.
type slowCodec struct{ cproto.Codec }

const marshalDelay = 300 * time.Millisecond

func (slowCodec) ID() byte     { return 29 }
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

// TestRestartedServerFoundAgain: after a graceful shutdown, a client with
// a static list calls a server restarted at the same address again (the
// read-only mark of the old one does not keep the address out forever).
func TestRestartedServerFoundAgain(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	start := func(l net.Listener) (*transport.Server, <-chan error) {
		srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
			b, _ := gproto.Marshal(&pb.StockReply{Sku: addr})
			resp.Payload = append(resp.Payload[:0], b...)
		}), transport.ServerConfig{Logger: quiet})
		done := make(chan error, 1)
		go func() { done <- srv.Serve(l) }()
		return srv, done
	}
	srv, done := start(l)
	c := client(t, []string{addr})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); err != nil {
		t.Fatalf("call before the restart: %v", err)
	}
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-done
	// Meanwhile the error says why the only instance is left out.
	if _, err := invoke(ctx, c); err == nil || !strings.Contains(err.Error(), "1 shutting down") {
		t.Errorf("call while the only instance is shut down = %v; want it to say the instance is shutting down", err)
	}

	l2, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	srv2, done2 := start(l2)
	defer func() { srv2.Close(); <-done2 }()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := invoke(ctx, c)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server restarted at %s is still not called after 5 s: %v", addr, err)
		}
		time.Sleep(10 * time.Millisecond) // no event says the address is back: poll the calls
	}
}

// TestCanceledWhileResolving: a caller that cancels its context while the
// client waits for the service's first lookup gets ErrCanceled, not
// ErrUnavailable.
func TestCanceledWhileResolving(t *testing.T) {
	c := proxy.NewClient(hangingRegistry{static.New()}, proxy.WithLogger(quiet),
		proxy.WithCache(registry.CacheConfig{InitialTimeout: 5 * time.Second, Logger: quiet}))
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	defer cancel()
	_, err := invoke(ctx, c, proxy.Timeout(5*time.Second))
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want the caller's cancellation", err)
	}
	if !errors.Is(err, proxy.ErrCanceled) || errors.Is(err, proxy.ErrUnavailable) {
		t.Errorf("a call whose context was cancelled while resolving: %v; ErrCanceled = %v, ErrUnavailable = %v; want ErrCanceled only",
			err, errors.Is(err, proxy.ErrCanceled), errors.Is(err, proxy.ErrUnavailable))
	}
}

// TestConfigErrorIsBadRequest: a client configured with a balancer that
// does not exist fails its calls as a bad request, not as an outage that
// retrying could cure.
func TestConfigErrorIsBadRequest(t *testing.T) {
	c := client(t, []string{deadAddr(t)}, proxy.WithBalancer("nope"))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, err := invoke(ctx, c)
	if !errors.Is(err, proxy.ErrBadRequest) || errors.Is(err, proxy.ErrUnavailable) || !strings.Contains(err.Error(), `unknown balancer "nope"`) {
		t.Errorf("call with an unknown balancer = %v; want ErrBadRequest naming it, not ErrUnavailable", err)
	}
}
