package prometheus_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"sync"
	"testing"
	"time"

	prom "github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	gproto "google.golang.org/protobuf/proto"

	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/internal/promtest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	dabbprom "github.com/dabbrpc/dabb/proxy/prometheus"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

const (
	attempts    = "dabb_client_attempts_total"
	durations   = "dabb_client_attempt_duration_seconds"
	retries     = "dabb_client_retries_total"
	state       = "dabb_client_breaker_state"
	transitions = "dabb_client_breaker_transitions_total"
	breakers    = "dabb_client_breakers"
)

// labels is a series' label set; sample the value a series should have.
type (
	labels = promtest.Labels
	sample = promtest.Sample
)

const (
	svc   = "test.Svc"
	addrA = "10.0.0.1:20880"
	addrB = "10.0.0.2:20880"
	ok    = protocol.StatusOK
	busy  = protocol.StatusServerThreadpoolExhausted
)

func TestCounts(t *testing.T) {
	tests := []struct {
		name string
		opts []dabbprom.Option
		do   func(o *dabbprom.Observer)
		want []sample
	}{
		{
			name: "attempts by instance and status",
			do: func(o *dabbprom.Observer) {
				o.Attempted(svc, "M", addrA, ok, time.Millisecond)
				o.Attempted(svc, "M", addrA, ok, time.Millisecond)
				o.Attempted(svc, "M", addrB, protocol.StatusServiceError, time.Millisecond)
				o.Attempted(svc, "N", addrA, ok, time.Millisecond)
			},
			want: []sample{
				{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": addrA, "status": "ok"}, Value: 2},
				{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": addrB, "status": "service error"}, Value: 1},
				{Name: attempts, Labels: labels{"service": svc, "method": "N", "instance": addrA, "status": "ok"}, Value: 1},
				{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": addrB, "status": "ok"}, Absent: true},
				{Name: durations, Labels: labels{"service": svc, "method": "M"}, Value: 3},
				{Name: durations, Labels: labels{"service": svc, "method": "N"}, Value: 1},
			},
		},
		{
			name: "retries by reason",
			do: func(o *dabbprom.Observer) {
				o.Retried(svc, "M", busy)
				o.Retried(svc, "M", busy)
				o.Retried(svc, "M", protocol.StatusChannelInactive)
			},
			want: []sample{
				{Name: retries, Labels: labels{"service": svc, "method": "M", "reason": "server threadpool exhausted"}, Value: 2},
				{Name: retries, Labels: labels{"service": svc, "method": "M", "reason": "channel inactive"}, Value: 1},
			},
		},
		{
			name: "breaker state and transitions",
			do: func(o *dabbprom.Observer) {
				o.BreakerChanged(addrA, "closed", "open")
				o.BreakerChanged(addrA, "open", "half-open")
				o.BreakerChanged(addrA, "half-open", "open")
				o.BreakerChanged(addrB, "closed", "open")
				o.BreakerChanged(addrB, "open", "half-open")
				o.BreakerChanged(addrB, "half-open", "closed")
			},
			want: []sample{
				{Name: state, Labels: labels{"instance": addrA}, Value: 2},
				{Name: state, Labels: labels{"instance": addrB}, Value: 0},
				{Name: transitions, Labels: labels{"instance": addrA, "to": "open"}, Value: 2},
				{Name: transitions, Labels: labels{"instance": addrA, "to": "half-open"}, Value: 1},
				{Name: transitions, Labels: labels{"instance": addrB, "to": "closed"}, Value: 1},
				{Name: breakers, Labels: labels{"state": "open"}, Absent: true},
			},
		},
		{
			name: "unknown breaker state is counted, gauge untouched",
			do: func(o *dabbprom.Observer) {
				o.BreakerChanged(addrA, "closed", "half-open")
				o.BreakerChanged(addrA, "half-open", "unknown state: 7")
			},
			want: []sample{
				{Name: state, Labels: labels{"instance": addrA}, Value: 1},
				{Name: transitions, Labels: labels{"instance": addrA, "to": "unknown state: 7"}, Value: 1},
			},
		},
		{
			name: "without instance label",
			opts: []dabbprom.Option{dabbprom.WithoutInstanceLabel()},
			do: func(o *dabbprom.Observer) {
				o.Attempted(svc, "M", addrA, ok, time.Millisecond)
				o.Attempted(svc, "M", addrB, ok, time.Millisecond)
				o.Attempted(svc, "M", addrB, busy, time.Millisecond)
				o.BreakerChanged(addrA, "closed", "open")
				o.BreakerChanged(addrB, "closed", "open")
				o.BreakerChanged(addrB, "open", "half-open")
				o.BreakerChanged("10.0.0.3:20880", "closed", "open")
				o.BreakerChanged("10.0.0.3:20880", "open", "half-open")
				o.BreakerChanged("10.0.0.3:20880", "half-open", "closed")
			},
			want: []sample{
				{Name: attempts, Labels: labels{"service": svc, "method": "M", "status": "ok"}, Value: 2},
				{Name: attempts, Labels: labels{"service": svc, "method": "M", "status": "server threadpool exhausted"}, Value: 1},
				{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": addrA, "status": "ok"}, Absent: true},
				{Name: durations, Labels: labels{"service": svc, "method": "M"}, Value: 3},
				{Name: transitions, Labels: labels{"to": "open"}, Value: 3},
				{Name: transitions, Labels: labels{"to": "half-open"}, Value: 2},
				{Name: transitions, Labels: labels{"to": "closed"}, Value: 1},
				{Name: breakers, Labels: labels{"state": "open"}, Value: 1},
				{Name: breakers, Labels: labels{"state": "half-open"}, Value: 1},
				{Name: state, Labels: labels{"instance": addrA}, Absent: true},
			},
		},
		{
			name: "invalid UTF-8 in labels",
			do: func(o *dabbprom.Observer) {
				o.Attempted("bad\xffsvc", "M\xfe", "\xff", ok, time.Millisecond)
				o.Retried("bad\xffsvc", "M\xfe", busy)
				o.BreakerChanged("\xff", "closed", "open")
			},
			want: []sample{
				{Name: attempts, Labels: labels{"service": "bad\uFFFDsvc", "method": "M\uFFFD", "instance": "\uFFFD", "status": "ok"}, Value: 1},
				{Name: retries, Labels: labels{"service": "bad\uFFFDsvc", "method": "M\uFFFD", "reason": "server threadpool exhausted"}, Value: 1},
				{Name: state, Labels: labels{"instance": "\uFFFD"}, Value: 2},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prom.NewRegistry()
			o, err := dabbprom.New(reg, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			tt.do(o)
			promtest.Check(t, reg, tt.want)
		})
	}
}

func TestHistogramBuckets(t *testing.T) {
	tests := []struct {
		name    string
		opts    []dabbprom.Option
		latency time.Duration
		le      float64 // the smallest bound that counts the observation
		below   float64 // the bound under it, which does not
		nbounds int
	}{
		{name: "default", latency: 3 * time.Millisecond, le: 0.005, below: 0.0025, nbounds: len(dabbprom.DefaultBuckets)},
		{name: "smallest", latency: 50 * time.Microsecond, le: 0.0001, below: math.Inf(-1), nbounds: len(dabbprom.DefaultBuckets)},
		{name: "custom", opts: []dabbprom.Option{dabbprom.WithBuckets(0.01, 0.1, 1)},
			latency: 40 * time.Millisecond, le: 0.1, below: 0.01, nbounds: 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prom.NewRegistry()
			o, err := dabbprom.New(reg, tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			o.Attempted(svc, "M", addrA, ok, tt.latency)
			m := promtest.Find(promtest.Gather(t, reg), durations, labels{"service": svc, "method": "M"})
			if m == nil {
				t.Fatal("no histogram series")
			}
			h := m.GetHistogram()
			if got := len(h.GetBucket()); got != tt.nbounds {
				t.Errorf("%d buckets, want %d", got, tt.nbounds)
			}
			if got, want := h.GetSampleSum(), tt.latency.Seconds(); math.Abs(got-want) > 1e-12 {
				t.Errorf("sum %v, want %v", got, want)
			}
			for _, b := range h.GetBucket() {
				want := uint64(0)
				if b.GetUpperBound() >= tt.le {
					want = 1
				}
				if b.GetUpperBound() == tt.below && b.GetCumulativeCount() != 0 {
					t.Errorf("bucket le=%v counts %d, want 0", b.GetUpperBound(), b.GetCumulativeCount())
				}
				if b.GetCumulativeCount() != want {
					t.Errorf("bucket le=%v counts %d, want %d", b.GetUpperBound(), b.GetCumulativeCount(), want)
				}
			}
		})
	}
}

func TestNewRejectsBadInput(t *testing.T) {
	tests := []struct {
		name string
		opts []dabbprom.Option
	}{
		{name: "no buckets", opts: []dabbprom.Option{dabbprom.WithBuckets()}},
		{name: "decreasing", opts: []dabbprom.Option{dabbprom.WithBuckets(1, 0.5)}},
		{name: "duplicate", opts: []dabbprom.Option{dabbprom.WithBuckets(0.1, 0.1)}},
		{name: "NaN", opts: []dabbprom.Option{dabbprom.WithBuckets(0.1, math.NaN())}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reg := prom.NewRegistry()
			o, err := dabbprom.New(reg, tt.opts...)
			if !errors.Is(err, dabbprom.ErrBadBuckets) {
				t.Fatalf("New = %v, %v; want ErrBadBuckets", o, err)
			}
			if mfs := promtest.Gather(t, reg); len(mfs) != 0 {
				t.Errorf("a failed New left %d metrics registered", len(mfs))
			}
		})
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

// flakyRegisterer fails its failAt'th Register and keeps the collectors
// registered through it.
type flakyRegisterer struct {
	prom.Registerer
	failAt, n int
	live      map[prom.Collector]bool
}

var errRefused = errors.New("test: registration refused")

func (r *flakyRegisterer) Register(c prom.Collector) error {
	r.n++
	if r.n == r.failAt {
		return errRefused
	}
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.live[c] = true
	return nil
}

func (r *flakyRegisterer) Unregister(c prom.Collector) bool {
	delete(r.live, c)
	return r.Registerer.Unregister(c)
}

func TestFailedNewUnregistersWhatItRegistered(t *testing.T) {
	for _, failAt := range []int{1, 3, 5} {
		t.Run(fmt.Sprintf("fail at %d", failAt), func(t *testing.T) {
			r := &flakyRegisterer{Registerer: prom.NewRegistry(), failAt: failAt, live: map[prom.Collector]bool{}}
			o, err := dabbprom.New(r)
			if !errors.Is(err, errRefused) {
				t.Fatalf("New = %v, %v; want the registerer's error", o, err)
			}
			if len(r.live) != 0 {
				t.Errorf("a failed New left %d collectors registered", len(r.live))
			}
		})
	}
}

func TestNilRegistererMeansDefault(t *testing.T) {
	reg := prom.NewRegistry()
	oldReg, oldGath := prom.DefaultRegisterer, prom.DefaultGatherer
	prom.DefaultRegisterer, prom.DefaultGatherer = reg, reg
	t.Cleanup(func() { prom.DefaultRegisterer, prom.DefaultGatherer = oldReg, oldGath })

	o, err := dabbprom.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	o.Attempted(svc, "M", addrA, ok, time.Millisecond)
	promtest.Check(t, reg, []sample{{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": addrA, "status": "ok"}, Value: 1}})
}

func TestObserversOnWrappedRegisterers(t *testing.T) {
	reg := prom.NewRegistry()
	var obs []*dabbprom.Observer
	for _, client := range []string{"orders", "billing"} {
		o, err := dabbprom.New(prom.WrapRegistererWith(prom.Labels{"client": client}, reg))
		if err != nil {
			t.Fatalf("New for client %s: %v", client, err)
		}
		obs = append(obs, o)
	}
	obs[0].Attempted(svc, "M", addrA, ok, time.Millisecond)
	obs[1].Attempted(svc, "M", addrA, ok, time.Millisecond)
	obs[1].Attempted(svc, "M", addrA, ok, time.Millisecond)
	promtest.Check(t, reg, []sample{
		{Name: attempts, Labels: labels{"client": "orders", "service": svc, "method": "M", "instance": addrA, "status": "ok"}, Value: 1},
		{Name: attempts, Labels: labels{"client": "billing", "service": svc, "method": "M", "instance": addrA, "status": "ok"}, Value: 2},
	})
}

func TestConcurrentUse(t *testing.T) {
	for _, noInstance := range []bool{false, true} {
		name := "instance label"
		var opts []dabbprom.Option
		if noInstance {
			name = "without instance label"
			opts = append(opts, dabbprom.WithoutInstanceLabel())
		}
		t.Run(name, func(t *testing.T) {
			reg := prom.NewRegistry()
			o, err := dabbprom.New(reg, opts...)
			if err != nil {
				t.Fatal(err)
			}
			const workers, rounds = 8, 500
			methods := []string{"A", "B", "C"}
			var wg sync.WaitGroup
			for w := range workers {
				addr := []string{addrA, addrB}[w%2]
				wg.Go(func() {
					for i := range rounds {
						m := methods[i%len(methods)]
						o.Attempted(svc, m, addr, ok, time.Duration(i)*time.Microsecond)
						o.Retried(svc, m, busy)
						if i%50 == 0 {
							// Each worker's own instance, so that the end state is known.
							inst := addr + "/" + string(rune('a'+w))
							o.BreakerChanged(inst, "closed", "open")
							o.BreakerChanged(inst, "open", "half-open")
						}
					}
				})
			}
			// Gather while the workers run: collection must be safe too.
			for range 5 {
				promtest.Gather(t, reg)
			}
			wg.Wait()

			mfs := promtest.Gather(t, reg)
			var total, hist, retried, opened float64
			for _, m := range mfs[attempts].GetMetric() {
				total += promtest.Value(m)
			}
			for _, m := range mfs[durations].GetMetric() {
				hist += promtest.Value(m)
			}
			for _, m := range mfs[retries].GetMetric() {
				retried += promtest.Value(m)
			}
			for _, m := range mfs[transitions].GetMetric() {
				opened += promtest.Value(m)
			}
			want := float64(workers * rounds)
			if total != want || hist != want || retried != want {
				t.Errorf("attempts %v, observations %v, retries %v; want %v each", total, hist, retried, want)
			}
			if wantTr := float64(workers * rounds / 50 * 2); opened != wantTr {
				t.Errorf("%v transitions, want %v", opened, wantTr)
			}
			if noInstance {
				promtest.Check(t, reg, []sample{
					{Name: breakers, Labels: labels{"state": "half-open"}, Value: workers},
					{Name: breakers, Labels: labels{"state": "open"}, Value: 0},
				})
			} else if n := len(mfs[state].GetMetric()); n != workers {
				t.Errorf("%d breaker_state series, want %d", n, workers)
			}
		})
	}
}

func TestHotPathDoesNotAllocate(t *testing.T) {
	for _, noInstance := range []bool{false, true} {
		var opts []dabbprom.Option
		if noInstance {
			opts = append(opts, dabbprom.WithoutInstanceLabel())
		}
		o, err := dabbprom.New(prom.NewRegistry(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		o.Attempted(svc, "M", addrA, ok, time.Millisecond)
		o.Retried(svc, "M", busy)
		if n := testing.AllocsPerRun(100, func() {
			o.Attempted(svc, "M", addrA, ok, time.Millisecond)
			o.Retried(svc, "M", busy)
		}); n != 0 {
			t.Errorf("noInstance=%v: %v allocations per steady Attempted+Retried, want 0", noInstance, n)
		}
	}
}

// server starts a transport server on loopback: method "Fail" answers
// with a service error, "Busy" with status 100, anything else with a
// StockReply.
// server starts a server whose handler answers OK (failing method Fail
// with 70), or with status failAll to every call when it is not zero.
func server(t *testing.T, failAll protocol.Status) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	quiet := slog.New(slog.DiscardHandler)
	srv := transport.NewServer(transport.HandlerFunc(func(_ context.Context, req, resp *protocol.Message) {
		switch {
		case failAll != 0:
			resp.Header.SetStatus(failAll)
			resp.Payload = append(resp.Payload[:0], "test: failed"...)
		case req.Method == "Fail":
			resp.Header.SetStatus(protocol.StatusServiceError)
			resp.Payload = append(resp.Payload[:0], "test: failed"...)
		default:
			b, _ := gproto.Marshal(&pb.StockReply{Sku: req.Method})
			resp.Payload = append(resp.Payload[:0], b...)
		}
	}), transport.ServerConfig{Logger: quiet})
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return l.Addr().String()
}

func newClient(t *testing.T, obs proxy.Observer, addrs []string, opts ...proxy.Option) *proxy.Client {
	t.Helper()
	var ins []registry.Instance
	for _, a := range addrs {
		ins = append(ins, registry.Instance{Service: svc, ID: a, Addr: a})
	}
	opts = append([]proxy.Option{proxy.WithLogger(slog.New(slog.DiscardHandler)), proxy.WithObserver(obs)}, opts...)
	c, err := proxy.NewClient(static.New(ins...), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestEndToEnd(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	addr := server(t, 0)
	reg := prom.NewRegistry()
	obs, err := dabbprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, obs, []string{addr})

	const calls = 5
	for i := range calls {
		resp := new(pb.StockReply)
		if err := c.Invoke(ctx, svc, "M", &pb.StockRequest{Sku: "x"}, resp); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	err = c.Invoke(ctx, svc, "Fail", &pb.StockRequest{Sku: "x"}, new(pb.StockReply))
	if !errors.Is(err, proxy.ErrServiceError) {
		t.Fatalf("Fail = %v, want a service error", err)
	}
	promtest.Check(t, reg, []sample{
		{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": addr, "status": "ok"}, Value: calls},
		{Name: attempts, Labels: labels{"service": svc, "method": "Fail", "instance": addr, "status": "service error"}, Value: 1},
		{Name: durations, Labels: labels{"service": svc, "method": "M"}, Value: calls},
		{Name: durations, Labels: labels{"service": svc, "method": "Fail"}, Value: 1},
		{Name: retries, Labels: labels{"service": svc, "method": "Fail", "reason": "service error"}, Absent: true},
	})
}

func TestEndToEndRetryAndBreaker(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	// Nothing listens at bad: a refused dial counts for the breaker and,
	// not sent, is retried. (A 100 is retried but does not count.)
	good := server(t, 0)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bad := l.Addr().String()
	l.Close()
	reg := prom.NewRegistry()
	obs, err := dabbprom.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	// Round robin sends one of the first two calls to bad; its breaker
	// opens on that one failure and keeps it out from then on.
	c := newClient(t, obs, []string{good, bad},
		proxy.WithBalancer("round_robin"),
		proxy.WithBreaker(proxy.BreakerConfig{ConsecutiveFailures: 1, OpenTimeout: time.Minute}),
		proxy.WithRetry(proxy.RetryPolicy{MaxAttempts: 2}))

	const calls = 6
	for i := range calls {
		if err := c.Invoke(ctx, svc, "M", &pb.StockRequest{Sku: "x"}, new(pb.StockReply)); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	promtest.Check(t, reg, []sample{
		{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": good, "status": "ok"}, Value: calls},
		{Name: attempts, Labels: labels{"service": svc, "method": "M", "instance": bad, "status": "channel inactive"}, Value: 1},
		{Name: durations, Labels: labels{"service": svc, "method": "M"}, Value: calls + 1},
		{Name: retries, Labels: labels{"service": svc, "method": "M", "reason": "channel inactive"}, Value: 1},
		{Name: state, Labels: labels{"instance": bad}, Value: 2},
		{Name: transitions, Labels: labels{"instance": bad, "to": "open"}, Value: 1},
		{Name: state, Labels: labels{"instance": good}, Absent: true},
	})
}

func BenchmarkAttempted(b *testing.B) {
	for _, tc := range []struct {
		name string
		opts []dabbprom.Option
	}{
		{name: "instance"},
		{name: "no-instance", opts: []dabbprom.Option{dabbprom.WithoutInstanceLabel()}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			o, err := dabbprom.New(prom.NewRegistry(), tc.opts...)
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					o.Attempted(svc, "Deduct", addrA, ok, 750*time.Microsecond)
				}
			})
		})
	}
}

func BenchmarkRetried(b *testing.B) {
	o, err := dabbprom.New(prom.NewRegistry())
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			o.Retried(svc, "Deduct", busy)
		}
	})
}

// BenchmarkWithLabelValues is what Attempted would cost without its cache.
func BenchmarkWithLabelValues(b *testing.B) {
	reg := prom.NewRegistry()
	cv := prom.NewCounterVec(prom.CounterOpts{Name: "x_total", Help: "x"}, []string{"service", "method", "instance", "status"})
	hv := prom.NewHistogramVec(prom.HistogramOpts{Name: "x_seconds", Help: "x", Buckets: dabbprom.DefaultBuckets}, []string{"service", "method"})
	reg.MustRegister(cv, hv)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			cv.WithLabelValues(svc, "Deduct", addrA, ok.String()).Inc()
			hv.WithLabelValues(svc, "Deduct").Observe(0.00075)
		}
	})
}
