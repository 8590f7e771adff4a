package proxy_test

import (
	"bufio"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
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
	srv, done := serveOK(l)
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
	if _, err := invoke(ctx, c); err == nil || !strings.Contains(err.Error(), "its only known instance is shutting down") {
		t.Errorf("call while the only instance is shut down = %v; want it to say the instance is shutting down", err)
	}

	restartAndCall(t, c, addr)
}

// serveOK serves l with a transport server answering every call with a
// StockReply naming l's address; the channel gets Serve's result.
func serveOK(l net.Listener) (*transport.Server, <-chan error) {
	addr := l.Addr().String()
	srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		b, _ := gproto.Marshal(&pb.StockReply{Sku: addr})
		resp.Payload = append(resp.Payload[:0], b...)
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	return srv, done
}

// restartAndCall serves addr again, after its server went away, and calls
// through c until a call succeeds, within 5 s.
func restartAndCall(t *testing.T, c *proxy.Client, addr string) {
	t.Helper()
	l, err := net.Listen("tcp", addr)
	if err != nil {
		t.Skipf("cannot listen again on %s: %v", addr, err)
	}
	srv, done := serveOK(l)
	defer func() { srv.Close(); <-done }()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := invoke(ctx, c)
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server restarted at %s is not called within 5 s (breaker %s): %v", addr, c.BreakerState(addr), err)
		}
		time.Sleep(10 * time.Millisecond) // no event says the address is back: poll the calls
	}
}

// TestCanceledWhileResolving: a caller that cancels its context while the
// client waits for the service's first lookup gets ErrCanceled, not
// ErrUnavailable.
func TestCanceledWhileResolving(t *testing.T) {
	c := newClient(t, hangingRegistry{static.New()}, proxy.WithLogger(quiet),
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

// TestInvalidServiceIsBadRequest: a service name the registry refuses
// fails the call as a bad request, not as an outage that retrying could
// cure.
func TestInvalidServiceIsBadRequest(t *testing.T) {
	c := client(t, []string{deadAddr(t)})
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	err := c.Invoke(ctx, "bad/name", "M", &pb.StockRequest{Sku: "x"}, new(pb.StockReply))
	if !errors.Is(err, proxy.ErrBadRequest) || errors.Is(err, proxy.ErrUnavailable) || !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("call to an invalid service name = %v; want ErrBadRequest wrapping registry.ErrInvalid, not ErrUnavailable", err)
	}
}

// drainingServer accepts connections, sends each the read-only event and
// answers every request "server shutting down" (100), as a dabb server
// does once its Shutdown began.
func drainingServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	t.Cleanup(func() { l.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			nc, err := l.Accept()
			if err != nil {
				return
			}
			wg.Go(func() {
				defer nc.Close()
				if _, err := nc.Write(protocol.AppendReadOnly(nil, 1)); err != nil {
					return
				}
				rd := protocol.NewReader(bufio.NewReader(nc), 0)
				for {
					var req protocol.Message
					if err := rd.Read(&req); err != nil {
						return
					}
					var resp protocol.Message
					resp.Header.Init(protocol.MakeFlags(0, req.Header.Flags().Serialization()), protocol.StatusServerThreadpoolExhausted, req.Header.ID())
					resp.Payload = []byte("server shutting down")
					if _, err := nc.Write(protocol.AppendMessage(nil, &resp)); err != nil {
						return
					}
				}
			})
		}
	})
	return l.Addr().String()
}

// TestDrainingAddressKeepsItsBreaker: the answers of an address that
// announced its shutdown do not count against its breaker (the next
// process there, a restart on the same port, would inherit it).
func TestDrainingAddressKeepsItsBreaker(t *testing.T) {
	addr := drainingServer(t)
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := invoke(ctx, c); !errors.Is(err, proxy.ErrNotSent) && !errors.Is(err, proxy.ErrOverloaded) {
		t.Fatalf("call to a draining address = %v; want it refused", err)
	}
	if got := c.BreakerState(addr); got != "closed" {
		t.Errorf("the draining address's breaker is %s after its shutting-down answers; want closed", got)
	}
}

// TestRestartResetsTheBreaker: a server restarted at an address whose
// breaker is open gets calls as soon as it answers, not after the old
// process's open timeout.
func TestRestartResetsTheBreaker(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	failing := transport.NewServer(transport.HandlerFunc(func(_ context.Context, _, resp *protocol.Message) {
		resp.Header.SetStatus(protocol.StatusServerError) // 80: counts against the breaker
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- failing.Serve(l) }()
	c := client(t, []string{addr}, proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Hour}))
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, _ = invoke(ctx, c)
	if got := c.BreakerState(addr); got != "open" {
		t.Fatalf("breaker %s after a failure with ConsecutiveFailures 1; want open", got)
	}
	if err := failing.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	<-done
	restartAndCall(t, c, addr)
}
