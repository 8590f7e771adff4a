package prometheus_test

import (
	"context"
	"errors"
	"log/slog"
	"math"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/internal/dabbtest"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
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

// labels is a series' label set.
type labels map[string]string

// sample is the value a series should have; absent says it should not
// exist.
type sample struct {
	name   string
	labels labels
	value  float64
	absent bool
}

func gather(t *testing.T, g prom.Gatherer) map[string]*dto.MetricFamily {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := make(map[string]*dto.MetricFamily, len(mfs))
	for _, mf := range mfs {
		out[mf.GetName()] = mf
	}
	return out
}

// find returns the series of name with exactly the labels want.
func find(mfs map[string]*dto.MetricFamily, name string, want labels) *dto.Metric {
	for _, m := range mfs[name].GetMetric() {
		if len(m.GetLabel()) != len(want) {
			continue
		}
		match := true
		for _, lp := range m.GetLabel() {
			if v, ok := want[lp.GetName()]; !ok || v != lp.GetValue() {
				match = false
				break
			}
		}
		if match {
			return m
		}
	}
	return nil
}

// value is a series' counter or gauge value, or a histogram's count.
func value(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	}
	return math.NaN()
}

func check(t *testing.T, g prom.Gatherer, want []sample) {
	t.Helper()
	mfs := gather(t, g)
	for _, s := range want {
		m := find(mfs, s.name, s.labels)
		switch {
		case s.absent && m != nil:
			t.Errorf("%s%v exists with value %v, want no such series", s.name, s.labels, value(m))
		case s.absent:
		case m == nil:
			t.Errorf("%s%v: no such series; want %v", s.name, s.labels, s.value)
		case value(m) != s.value:
			t.Errorf("%s%v = %v, want %v", s.name, s.labels, value(m), s.value)
		}
	}
}

// gauge reads one series of name, or -1 when there is none.
func gauge(t *testing.T, g prom.Gatherer, name string, l labels) float64 {
	t.Helper()
	if m := find(gather(t, g), name, l); m != nil {
		return value(m)
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
	check(t, reg, []sample{
		{name: calls, labels: labels{"service": svc, "method": "Do", "status": "ok"}, value: oks + 1},
		{name: calls, labels: labels{"service": svc, "method": "Do", "status": "service error"}, value: 1},
		{name: calls, labels: labels{"service": svc, "method": "Do", "status": "bad request"}, value: 1},
		{name: calls, labels: labels{"service": svc, "method": "Nope", "status": "service not found"}, absent: true},
		{name: durations, labels: do1, value: oks + 3},
		{name: inFlight, labels: do1, value: 0},
		{name: rejections, labels: labels{"reason": "auth"}, value: 1},
		{name: rejections, labels: labels{"reason": "unimplemented"}, value: 1},
		{name: rejections, labels: labels{"reason": "overload"}, value: 1},
		{name: rejections, labels: labels{"reason": "budget_spent"}, value: 1},
		{name: rejections, labels: labels{"reason": "bad_request"}, value: 1},
		{name: rejections, labels: labels{"reason": "shutdown"}, value: 0},
		{name: connections, labels: labels{}, value: 1},
	})
	if n := len(gather(t, reg)[calls].GetMetric()); n != 3 {
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
		if mfs := gather(t, reg); len(mfs) != 0 {
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
