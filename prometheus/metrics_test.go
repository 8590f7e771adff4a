package prometheus_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/internal/dabbtest"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/internal/promtest"
	"github.com/dabbrpc/dabb/internal/wait"
	dabbprom "github.com/dabbrpc/dabb/prometheus"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	clientprom "github.com/dabbrpc/dabb/proxy/prometheus"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

const (
	calls       = "dabb_server_calls_total"
	durations   = "dabb_server_handling_duration_seconds"
	inFlight    = "dabb_server_in_flight"
	rejections  = "dabb_server_rejections_total"
	connections = "dabb_server_connections"

	svc   = "test.Svc"
	token = "Bearer good"
)

var quiet = slog.New(slog.DiscardHandler)

// labels is a series' label set; sample the value a series should have.
type (
	labels = promtest.Labels
	sample = promtest.Sample
)

// gauge reads one series of name, or -1 when there is none.
func gauge(t *testing.T, g prom.Gatherer, name string, l labels) float64 {
	t.Helper()
	if m := promtest.Find(promtest.Gather(t, g), name, l); m != nil {
		return promtest.Value(m)
	}
	return -1
}

// testService's method Do answers its request's sku back, fails for
// "fail", and for "block" waits for entered to be read and release to
// close.
type testService struct {
	entered chan struct{}
	release chan struct{}
}

var desc = dabb.ServiceDesc{
	Name: svc,
	Methods: []dabb.MethodDesc{{
		Name: "Do",
		Handler: func(srv any, ctx context.Context, dec func(any) error) (any, error) {
			ts := srv.(*testService)
			req := new(pb.StockRequest)
			if err := dec(req); err != nil {
				return nil, err
			}
			switch req.GetSku() {
			case "fail":
				return nil, errors.New("test: asked to fail")
			case "block":
				ts.entered <- struct{}{}
				select {
				case <-ts.release:
				case <-ctx.Done():
					return nil, ctx.Err()
				}
			}
			return &pb.StockReply{Sku: req.GetSku()}, nil
		},
	}},
}

// serve starts a server on loopback with opts and returns its address.
// It is closed when the test ends.
func serve(t *testing.T, ts *testService, opts ...dabb.Option) (*dabb.Server, string) {
	t.Helper()
	s := dabb.NewServer(append([]dabb.Option{dabb.WithLogger(quiet)}, opts...)...)
	if err := s.RegisterService(&desc, ts); err != nil {
		t.Fatal(err)
	}
	return s, dabbtest.Serve(t, s)
}

// TestServerMetrics: a real server and client make known calls, and the
// server's metrics count each exactly once, where it belongs.
func TestServerMetrics(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reg := prom.NewRegistry()
	m, err := dabbprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	ts := &testService{entered: make(chan struct{}, 1), release: make(chan struct{})}
	_, addr := serve(t, ts, dabb.WithObserver(m),
		dabb.WithInterceptor(m.Interceptor(), dabb.RequireToken("good")),
		dabb.WithTransport(transport.ServerConfig{MaxConcurrent: 1}))

	c, err := proxy.NewClient(static.New(registry.Instance{Service: svc, ID: addr, Addr: addr}),
		proxy.WithLogger(quiet), proxy.WithTransport(transport.Config{ConnsPerAddr: 1}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	do := func(method, sku, auth string, opts ...proxy.CallOption) error {
		opts = append(opts, proxy.Attachment(protocol.AttachAuthorization, auth))
		return c.Invoke(ctx, svc, method, &pb.StockRequest{Sku: sku}, new(pb.StockReply), opts...)
	}

	const oks = 3
	for i := range oks {
		if err := do("Do", "ok", token); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	if err := do("Do", "fail", token); !errors.Is(err, proxy.ErrServiceError) {
		t.Fatalf("fail: %v, want a service error", err)
	}
	if err := do("Do", "ok", "Bearer bad"); !errors.Is(err, proxy.ErrUnauthenticated) {
		t.Fatalf("wrong token: %v, want ErrUnauthenticated", err)
	}
	if err := do("Nope", "ok", token); !errors.Is(err, proxy.ErrNotFound) {
		t.Fatalf("unknown method: %v, want ErrNotFound", err)
	}

	// One call holds the only slot: the next is refused, overloaded.
	blocked := make(chan error, 1)
	go func() { blocked <- do("Do", "block", token) }()
	select {
	case <-ts.entered:
	case <-ctx.Done():
		t.Fatal("timed out waiting for the blocking call to reach its handler")
	}
	if got := gauge(t, reg, inFlight, labels{"service": svc, "method": "Do"}); got != 1 {
		t.Errorf("in flight %v while one call blocks, want 1", got)
	}
	if err := do("Do", "ok", token, proxy.FailFast()); !errors.Is(err, proxy.ErrOverloaded) {
		t.Fatalf("call over MaxConcurrent: %v, want ErrOverloaded", err)
	}
	close(ts.release)
	if err := <-blocked; err != nil {
		t.Fatalf("blocking call: %v", err)
	}

	// A spent budget and a serialization the server does not have come
	// from a bare transport pool, which sends them as told.
	pool := transport.NewPool(transport.Config{ConnsPerAddr: 1, Logger: quiet, Serializations: codec.Known})
	for i, tc := range []struct {
		ser     byte
		timeout time.Duration
		want    protocol.Status
	}{
		{ser: 22, timeout: -1, want: protocol.StatusServerTimeout},
		// Dubbo's java serialization: the server answers 40 in the peer's
		// words, which the pool reads as a peer that is not a dabb server
		// (50) before it closes the connection.
		{ser: 3, timeout: time.Second, want: protocol.StatusBadResponse},
	} {
		req := &protocol.Message{Service: svc, Method: "Do", Timeout: tc.timeout}
		req.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, tc.ser), 0, 0)
		resp, err := pool.RoundTrip(ctx, addr, req)
		if err == nil {
			pool.Release(resp)
		}
		if got := protocol.StatusOf(err); got != tc.want {
			t.Errorf("serialization %d, timeout %v: status %v (%v), want %v", tc.ser, tc.timeout, got, err, tc.want)
		}
		if i == 0 {
			if got := gauge(t, reg, connections, labels{}); got != 2 {
				t.Errorf("%v connections open, want 2: the client's and the pool's", got)
			}
		}
	}
	pool.Close()
	wait.Until(t, 5*time.Second, time.Millisecond, "the server to count the pool's connection closed", func() bool {
		return gauge(t, reg, connections, labels{}) == 1
	})

	do1 := labels{"service": svc, "method": "Do"}
	promtest.Check(t, reg, []sample{
		{Name: calls, Labels: labels{"service": svc, "method": "Do", "status": "ok"}, Value: oks + 1},
		{Name: calls, Labels: labels{"service": svc, "method": "Do", "status": "service error"}, Value: 1},
		{Name: calls, Labels: labels{"service": svc, "method": "Do", "status": "bad request"}, Value: 1},
		{Name: calls, Labels: labels{"service": svc, "method": "Nope", "status": "service not found"}, Absent: true},
		{Name: durations, Labels: do1, Value: oks + 3},
		{Name: inFlight, Labels: do1, Value: 0},
		{Name: rejections, Labels: labels{"reason": "auth"}, Value: 1},
		{Name: rejections, Labels: labels{"reason": "unimplemented"}, Value: 1},
		{Name: rejections, Labels: labels{"reason": "overload"}, Value: 1},
		{Name: rejections, Labels: labels{"reason": "budget_spent"}, Value: 1},
		{Name: rejections, Labels: labels{"reason": "bad_request"}, Value: 1},
		{Name: rejections, Labels: labels{"reason": "shutdown"}, Value: 0},
		{Name: rejections, Labels: labels{"reason": "max_conns"}, Value: 0},
		{Name: connections, Labels: labels{}, Value: 1},
	})
	if n := len(promtest.Gather(t, reg)[calls].GetMetric()); n != 3 {
		t.Errorf("%d calls_total series, want 3", n)
	}
}

// TestInterceptorAllocs: a steady call through the interceptor costs no
// allocation of its own.
func TestInterceptorAllocs(t *testing.T) {
	m, err := dabbprom.New(prom.NewRegistry())
	if err != nil {
		t.Fatal(err)
	}
	icpt := m.Interceptor()
	info := &dabb.CallInfo{Service: svc, Method: "Do"}
	reply := &pb.StockReply{}
	next := func(context.Context) (any, error) { return reply, nil }
	ctx := context.Background()
	_, _ = icpt(ctx, info, next)
	if n := testing.AllocsPerRun(1000, func() { _, _ = icpt(ctx, info, next) }); n != 0 {
		t.Errorf("the interceptor allocates %v times a call, want 0", n)
	}
	if n := testing.AllocsPerRun(1000, func() { m.Rejected(transport.RejectOverload) }); n != 0 {
		t.Errorf("Rejected allocates %v times, want 0", n)
	}
}

func TestNewRejectsBadBuckets(t *testing.T) {
	for _, b := range [][]float64{{}, {1, 0.5}, {0.1, 0.1}, {0.1, math.NaN()}} {
		reg := prom.NewRegistry()
		if _, err := dabbprom.New(reg, dabbprom.WithBuckets(b...)); !errors.Is(err, dabbprom.ErrBadBuckets) {
			t.Errorf("buckets %v: %v, want ErrBadBuckets", b, err)
		}
		if mfs := promtest.Gather(t, reg); len(mfs) != 0 {
			t.Errorf("buckets %v: a failed New left %d metrics registered", b, len(mfs))
		}
	}
}

func TestNewTwiceOnOneRegistry(t *testing.T) {
	reg := prom.NewRegistry()
	if _, err := dabbprom.New(reg); err != nil {
		t.Fatal(err)
	}
	_, err := dabbprom.New(reg)
	var are prom.AlreadyRegisteredError
	if !errors.As(err, &are) {
		t.Fatalf("second New = %v, want a prom.AlreadyRegisteredError", err)
	}
}

// TestBesideClientMetrics: the server's and the client's metrics share a
// registry.
func TestBesideClientMetrics(t *testing.T) {
	reg := prom.NewRegistry()
	if _, err := dabbprom.New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := clientprom.New(reg); err != nil {
		t.Fatalf("client metrics on the server's registry: %v", err)
	}
}
