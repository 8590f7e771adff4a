package main

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/health"
	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// The embedded etcd leaves these behind briefly after it stops.
		goleak.IgnoreTopFunction("go.opencensus.io/stats/view.(*worker).start"),
	)
}

// TestDemo runs the whole demo, embedded etcd included, as
// `go run ./examples/inventory` does, and checks its summary.
func TestDemo(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out strings.Builder
	cfg := config{mode: "demo", instances: 3, calls: 1000, workers: 16}
	if err := runDemo(ctx, &out, cfg); err != nil {
		t.Fatalf("demo failed: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		"registry: embedded etcd at 127.0.0.1:",
		"instances: 3 published as inventory.Inventory",
		"shut down gracefully",
		"(shutting down: calls sent before the client learned it)",
		"0 failed",
		"stock consistent, no failed calls",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("summary lacks %q:\n%s", want, out.String())
		}
	}
}

// TestServerAndClientModes runs the two-terminal form: a server alone, and
// a client that finds it through a static registry.
func TestServerAndClientModes(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srvCtx, stopServer := context.WithCancel(ctx)
	var srvOut syncBuilder
	done := make(chan error, 1)
	go func() { done <- runServer(srvCtx, &srvOut, config{addr: addr}) }()

	// The client starts once the server listens (it says so): a client
	// that found nobody would fail its calls, and its breaker would open.
	select {
	case <-srvOut.serving():
	case err := <-done:
		t.Fatalf("server ended before serving: %v\n%s", err, srvOut.String())
	case <-ctx.Done():
		t.Fatalf("the server never said it was serving:\n%s", srvOut.String())
	}
	var out strings.Builder
	cfg := config{registry: "static://" + addr, calls: 500, workers: 8}
	if cerr := runClient(ctx, &out, cfg); cerr != nil {
		t.Fatalf("client: %v\n%s", cerr, out.String())
	}
	if !strings.Contains(out.String(), "0 failed") {
		t.Errorf("client summary: %s", out.String())
	}
	stopServer()
	if err := <-done; err != nil {
		t.Fatalf("server: %v", err)
	}
	if !strings.Contains(srvOut.String(), "stopped: served 5") {
		t.Errorf("server summary: %s", srvOut.String())
	}
}

// syncBuilder is a strings.Builder safe for a writer and a reader in two
// goroutines.
type syncBuilder struct {
	mu   sync.Mutex
	b    strings.Builder
	up   chan struct{} // closed once "serving " was written
	once sync.Once     // makes up
	shut sync.Once     // closes up
}

func (s *syncBuilder) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if strings.Contains(string(p), "serving ") {
		up := s.serving()
		s.shut.Do(func() { close(up) })
	}
	return s.b.Write(p)
}

// serving returns a channel closed once the server said it is serving.
func (s *syncBuilder) serving() chan struct{} {
	s.once.Do(func() { s.up = make(chan struct{}) })
	return s.up
}

func (s *syncBuilder) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestServerRequiresToken: a server given a token refuses a call without
// it, admits one with it, and answers a health check without it.
func TestServerRequiresToken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	srvCtx, stopServer := context.WithCancel(ctx)
	var srvOut syncBuilder
	done := make(chan error, 1)
	go func() { done <- runServer(srvCtx, &srvOut, config{addr: addr, token: "s3cret"}) }()
	select {
	case <-srvOut.serving():
	case err := <-done:
		t.Fatalf("server ended before serving: %v\n%s", err, srvOut.String())
	case <-ctx.Done():
		t.Fatalf("the server never said it was serving:\n%s", srvOut.String())
	}

	c, err := proxy.NewClient(static.New(registry.Instance{Addr: addr}))
	if err != nil {
		t.Fatal(err)
	}
	inv := inventory.NewInventoryClient(c)
	if _, err := inv.Stock(ctx, &pb.StockRequest{Sku: "sku-1"}); !errors.Is(err, proxy.ErrUnauthenticated) {
		t.Errorf("Stock without the token = %v, want ErrUnauthenticated", err)
	}
	tctx := proxy.WithCallOptions(ctx, proxy.Attachment(dabb.AttachAuthorization, "Bearer s3cret"))
	if r, err := inv.Stock(tctx, &pb.StockRequest{Sku: "sku-1"}); err != nil || r.Count != skus["sku-1"] {
		t.Errorf("Stock with the token = %v, %v; want %d", r, err, skus["sku-1"])
	}
	hc, err := proxy.NewClient(static.New(registry.Instance{Addr: addr}), proxy.WithCodec("json"))
	if err != nil {
		t.Fatal(err)
	}
	var reply health.CheckReply
	err = hc.Invoke(ctx, health.ServiceName, health.MethodCheck, &health.CheckRequest{}, &reply)
	if err != nil || reply.Status != health.Serving {
		t.Errorf("a health check without the token = %q, %v; want serving", reply.Status, err)
	}
	c.Close()
	hc.Close()
	stopServer()
	if err := <-done; err != nil {
		t.Fatalf("server: %v", err)
	}
}
