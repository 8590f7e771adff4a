// Metrics: a server's calls, rejections and connections as Prometheus metrics.

package prometheus

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/promutil"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

// ErrBadBuckets is returned by New for histogram buckets that are empty,
// not strictly increasing or not numbers.
var ErrBadBuckets = promutil.ErrBadBuckets

// DefaultBuckets are the upper bounds, in seconds, of the handling
// duration histogram: from 100 µs to 10 s, as the client's.
var DefaultBuckets = promutil.DefaultBuckets()

// RejectAuth is the rejections_total reason of a call an interceptor
// refused with code unauthenticated or permission_denied.
const RejectAuth transport.Rejection = "auth"

// reasons are the rejections_total series made at New, at 0.
var reasons = []transport.Rejection{
	transport.RejectOverload, transport.RejectShutdown, transport.RejectBudgetSpent,
	transport.RejectBadRequest, transport.RejectUnimplemented, transport.RejectMaxConns, transport.RejectGoneAway, RejectAuth,
}

// Option configures a Metrics.
type Option func(*config)

type config struct{ buckets []float64 }

// WithBuckets sets the upper bounds, in seconds, of the handling duration
// histogram (default DefaultBuckets).
func WithBuckets(bounds ...float64) Option {
	return func(c *config) { c.buckets = append([]float64{}, bounds...) }
}

// Metrics records a dabb server's calls, rejections and connections as
// Prometheus metrics. Create it with New. It is safe for concurrent use;
// one Metrics may serve several servers, whose figures then add up.
type Metrics struct {
	calls       *prom.CounterVec
	durations   *prom.HistogramVec
	inFlight    *prom.GaugeVec
	rejections  *prom.CounterVec
	connections prom.Gauge

	// The rejections_total children by reason, made at New.
	byReason map[transport.Rejection]prom.Counter
	// The children of each method, found by their labels once, so that
	// a steady call costs one map lookup and no allocation.
	methods sync.Map // methodKey -> *methodMetrics
}

var _ transport.ServerObserver = (*Metrics)(nil)

type methodKey struct{ service, method string }

type methodMetrics struct {
	m        *Metrics
	svc, mth string
	inFlight prom.Gauge
	duration prom.Observer
	statuses sync.Map // protocol.Status -> prom.Counter
}

// New makes a Metrics and registers its metrics with reg
// (prom.DefaultRegisterer when nil). It fails if reg already holds them:
// make one Metrics per registry and share it, or wrap reg with a label
// (prom.WrapRegistererWith) for each server.
func New(reg prom.Registerer, opts ...Option) (*Metrics, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.buckets == nil {
		cfg.buckets = append([]float64(nil), DefaultBuckets...)
	}
	if err := promutil.CheckBuckets(cfg.buckets); err != nil {
		return nil, err
	}
	if reg == nil {
		reg = prom.DefaultRegisterer
	}
	m := &Metrics{byReason: make(map[transport.Rejection]prom.Counter, len(reasons))}
	m.calls = prom.NewCounterVec(prom.CounterOpts{
		Name: "dabb_server_calls_total",
		Help: "Calls that reached the server's interceptors, by the status answered.",
	}, []string{"service", "method", "status"})
	m.durations = prom.NewHistogramVec(prom.HistogramOpts{
		Name:    "dabb_server_handling_duration_seconds",
		Help:    "How long calls took from the interceptors to the reply, whatever their status.",
		Buckets: cfg.buckets,
	}, []string{"service", "method"})
	m.inFlight = prom.NewGaugeVec(prom.GaugeOpts{
		Name: "dabb_server_in_flight",
		Help: "Calls inside the server's interceptors and handlers now.",
	}, []string{"service", "method"})
	m.rejections = prom.NewCounterVec(prom.CounterOpts{
		Name: "dabb_server_rejections_total",
		Help: "Requests refused without running their handler, by reason.",
	}, []string{"reason"})
	m.connections = prom.NewGauge(prom.GaugeOpts{
		Name: "dabb_server_connections",
		Help: "Connections the server holds open.",
	})
	for _, r := range reasons {
		m.byReason[r] = m.rejections.WithLabelValues(string(r))
	}
	collectors := []prom.Collector{m.calls, m.durations, m.inFlight, m.rejections, m.connections}
	if err := promutil.Register(reg, "dabb server metrics", collectors...); err != nil {
		return nil, err
	}
	return m, nil
}

// Interceptor returns the interceptor that counts and times the calls.
// Give it to dabb.WithInterceptor first, so that it sees the refusals of
// the interceptors after it.
func (m *Metrics) Interceptor() dabb.Interceptor { return m.intercept }

func (m *Metrics) intercept(ctx context.Context, info *dabb.CallInfo, next dabb.CallHandler) (any, error) {
	mm := m.method(info.Service, info.Method)
	mm.inFlight.Inc()
	start := time.Now()
	reply, err := next(ctx)
	mm.duration.Observe(time.Since(start).Seconds())
	mm.inFlight.Dec()
	mm.count(dabb.StatusOf(err)).Inc()
	if err != nil && refusedAuth(err) {
		m.byReason[RejectAuth].Inc()
	}
	return reply, err
}

// refusedAuth reports an error whose code, sent to the caller, is one of
// the two refusals.
func refusedAuth(err error) bool {
	var pe *protocol.Error
	if !errors.As(err, &pe) || pe.Remote {
		return false // a downstream's code does not travel (see dabb.StatusOf)
	}
	return pe.Code == protocol.CodeUnauthenticated || pe.Code == protocol.CodePermissionDenied
}

// method returns the children of a method, made on its first call. The
// names are the server's own, of registered methods, so their number is
// bounded.
func (m *Metrics) method(service, method string) *methodMetrics {
	k := methodKey{service, method}
	if v, ok := m.methods.Load(k); ok {
		return v.(*methodMetrics)
	}
	mm := &methodMetrics{m: m, svc: labelValue(service), mth: labelValue(method)}
	mm.inFlight = m.inFlight.WithLabelValues(mm.svc, mm.mth)
	mm.duration = m.durations.WithLabelValues(mm.svc, mm.mth)
	v, _ := m.methods.LoadOrStore(k, mm)
	return v.(*methodMetrics)
}

// count returns the calls_total child of the method for status.
func (mm *methodMetrics) count(status protocol.Status) prom.Counter {
	if v, ok := mm.statuses.Load(status); ok {
		return v.(prom.Counter)
	}
	v, _ := mm.statuses.LoadOrStore(status, mm.m.calls.WithLabelValues(mm.svc, mm.mth, status.String()))
	return v.(prom.Counter)
}

// Rejected counts one request refused before the interceptors. A reason
// other than the transport's and the server's is counted under its own
// value.
func (m *Metrics) Rejected(reason transport.Rejection) {
	if c, ok := m.byReason[reason]; ok {
		c.Inc()
		return
	}
	m.rejections.WithLabelValues(labelValue(string(reason))).Inc()
}

// ConnOpened counts a connection opened.
func (m *Metrics) ConnOpened() { m.connections.Inc() }

// ConnClosed counts a connection closed.
func (m *Metrics) ConnClosed() { m.connections.Dec() }

// labelValue makes s a valid label value: Prometheus panics on invalid
// UTF-8, and a hand-written ServiceDesc may hold any bytes.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, string(utf8.RuneError))
}
