// The Observer: attempts, retries and breaker changes as Prometheus metrics.

package prometheus

import (
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	prom "github.com/prometheus/client_golang/prometheus"

	"github.com/dabbrpc/dabb/internal/promutil"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
)

// ErrBadBuckets is returned by New for histogram buckets that are empty,
// not strictly increasing or not numbers.
var ErrBadBuckets = promutil.ErrBadBuckets

// DefaultBuckets are the upper bounds, in seconds, of the attempt duration
// histogram: from 100 µs, a loopback call, to 10 s, well past any sensible
// RPC timeout.
var DefaultBuckets = promutil.DefaultBuckets()

// Breaker states as the breaker_state gauge reports them.
const (
	stateClosed   = "closed"
	stateHalfOpen = "half-open"
	stateOpen     = "open"
)

// Option configures an Observer.
type Option func(*config)

type config struct {
	noInstance bool
	buckets    []float64
}

// WithoutInstanceLabel drops the instance label, whose values grow with
// every instance address the client ever calls (see the package doc).
func WithoutInstanceLabel() Option { return func(c *config) { c.noInstance = true } }

// WithBuckets sets the upper bounds, in seconds, of the attempt duration
// histogram (default DefaultBuckets).
func WithBuckets(bounds ...float64) Option {
	return func(c *config) { c.buckets = append([]float64{}, bounds...) }
}

// Observer records a dabb client's attempts, retries and breaker changes as
// Prometheus metrics. Create it with New; it is safe for concurrent use,
// and one Observer may serve many clients.
type Observer struct {
	instance    bool // the instance label is on
	attempts    *prom.CounterVec
	durations   *prom.HistogramVec
	retries     *prom.CounterVec
	transitions *prom.CounterVec

	// With the instance label: the state of each instance's breaker.
	breakerState *prom.GaugeVec
	// Without it: how many breakers are in each state other than closed,
	// from notClosed.
	breakers  *prom.GaugeVec
	mu        sync.Mutex
	notClosed map[string]string // addr -> state; guarded by mu

	// The metric children, found by their labels once, so that a steady
	// call costs one map lookup and no allocation.
	attemptCache sync.Map // attemptKey -> *attemptMetrics
	retryCache   sync.Map // retryKey -> prom.Counter
}

var _ proxy.Observer = (*Observer)(nil)

type attemptKey struct {
	service, method, addr string
	status                protocol.Status
}

type attemptMetrics struct {
	count    prom.Counter
	duration prom.Observer
}

type retryKey struct {
	service, method string
	status          protocol.Status
}

// New makes an Observer and registers its metrics with reg
// (prom.DefaultRegisterer when nil). It fails if reg already holds them:
// make one Observer per registry and share it.
func New(reg prom.Registerer, opts ...Option) (*Observer, error) {
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
	o := &Observer{instance: !cfg.noInstance}
	attemptLabels := []string{"service", "method", "instance", "status"}
	transitionLabels := []string{"instance", "to"}
	if cfg.noInstance {
		attemptLabels = []string{"service", "method", "status"}
		transitionLabels = []string{"to"}
	}
	o.attempts = prom.NewCounterVec(prom.CounterOpts{
		Name: "dabb_client_attempts_total",
		Help: "Attempts the client sent or tried to send, by instance and status.",
	}, attemptLabels)
	o.durations = prom.NewHistogramVec(prom.HistogramOpts{
		Name:    "dabb_client_attempt_duration_seconds",
		Help:    "How long attempts took, whatever their status.",
		Buckets: cfg.buckets,
	}, []string{"service", "method"})
	o.retries = prom.NewCounterVec(prom.CounterOpts{
		Name: "dabb_client_retries_total",
		Help: "Calls tried again, by the status of the attempt that failed.",
	}, []string{"service", "method", "reason"})
	o.transitions = prom.NewCounterVec(prom.CounterOpts{
		Name: "dabb_client_breaker_transitions_total",
		Help: "Circuit breaker state changes, by the state entered.",
	}, transitionLabels)
	collectors := []prom.Collector{o.attempts, o.durations, o.retries, o.transitions}
	if cfg.noInstance {
		o.breakers = prom.NewGaugeVec(prom.GaugeOpts{
			Name: "dabb_client_breakers",
			Help: "Instances whose circuit breaker is in this state.",
		}, []string{"state"})
		o.breakers.WithLabelValues(stateHalfOpen)
		o.breakers.WithLabelValues(stateOpen)
		o.notClosed = map[string]string{}
		collectors = append(collectors, o.breakers)
	} else {
		o.breakerState = prom.NewGaugeVec(prom.GaugeOpts{
			Name: "dabb_client_breaker_state",
			Help: "State of the instance's circuit breaker: 0 closed, 1 half-open, 2 open.",
		}, []string{"instance"})
		collectors = append(collectors, o.breakerState)
	}
	if err := promutil.Register(reg, "dabb client metrics", collectors...); err != nil {
		return nil, err
	}
	return o, nil
}

// Attempted counts one attempt and observes its latency.
func (o *Observer) Attempted(service, method, addr string, status protocol.Status, latency time.Duration) {
	if !o.instance {
		addr = ""
	}
	k := attemptKey{service, method, addr, status}
	v, ok := o.attemptCache.Load(k)
	if !ok {
		v = o.attemptMetrics(k)
	}
	m := v.(*attemptMetrics)
	m.count.Inc()
	m.duration.Observe(latency.Seconds())
}

// attemptMetrics finds the children for k and caches them.
func (o *Observer) attemptMetrics(k attemptKey) any {
	svc, mth := labelValue(k.service), labelValue(k.method)
	m := &attemptMetrics{duration: o.durations.WithLabelValues(svc, mth)}
	if o.instance {
		m.count = o.attempts.WithLabelValues(svc, mth, labelValue(k.addr), k.status.String())
	} else {
		m.count = o.attempts.WithLabelValues(svc, mth, k.status.String())
	}
	v, _ := o.attemptCache.LoadOrStore(k, m)
	return v
}

// Retried counts one retry, labelled with the status that caused it.
func (o *Observer) Retried(service, method string, status protocol.Status) {
	k := retryKey{service, method, status}
	v, ok := o.retryCache.Load(k)
	if !ok {
		c := o.retries.WithLabelValues(labelValue(service), labelValue(method), status.String())
		v, _ = o.retryCache.LoadOrStore(k, c)
	}
	v.(prom.Counter).Inc()
}

// BreakerChanged counts a transition and updates the breaker gauges. A
// state other than "closed", "half-open" and "open" is counted but leaves
// the gauges alone.
func (o *Observer) BreakerChanged(addr, from, to string) {
	addr = labelValue(addr)
	value, known := stateValue(to)
	if !o.instance {
		o.transitions.WithLabelValues(labelValue(to)).Inc()
		if known {
			o.track(addr, to)
		}
		return
	}
	o.transitions.WithLabelValues(addr, labelValue(to)).Inc()
	if known {
		o.breakerState.WithLabelValues(addr).Set(value)
	}
}

// track keeps the count of breakers per state without the instance label.
func (o *Observer) track(addr, to string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if prev, ok := o.notClosed[addr]; ok {
		o.breakers.WithLabelValues(prev).Dec()
		delete(o.notClosed, addr)
	}
	if to != stateClosed {
		o.notClosed[addr] = to
		o.breakers.WithLabelValues(to).Inc()
	}
}

// stateValue is the breaker_state gauge's value for a state.
func stateValue(state string) (float64, bool) {
	switch state {
	case stateClosed:
		return 0, true
	case stateHalfOpen:
		return 1, true
	case stateOpen:
		return 2, true
	}
	return 0, false
}

// labelValue makes s a valid label value: Prometheus panics on invalid
// UTF-8.
func labelValue(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	return strings.ToValidUTF8(s, string(utf8.RuneError))
}
