// The circuit breakers: one per instance address, and which errors count.

package proxy

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sony/gobreaker/v2"

	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/transport"
)

// BreakerConfig configures the circuit breaker each instance gets. Fields
// left zero take their defaults.
//
// A breaker counts only failures that speak of the instance. These are
// connection failures, attempts that timed out after sending, and status
// 80. A method's own error (70) counts as a success. So does a rejection
// with code unauthenticated or permission_denied, whatever its status.
// Some outcomes count neither way: a call the caller gave up on, a shed
// call (100), an attempt the dial backoff refused, and a failure from an
// address shutting down.
// A timeout counts whichever deadline ended the attempt, the method's or
// the caller's.
//
// While a breaker is open its instance is left out of balancing. After
// the open period the client sends the instance a heartbeat. No call goes
// there until it answers. Then the breaker is half-open: it lets
// HalfOpenProbes calls through, and closes again when they succeed. A
// heartbeat unanswered, or a probe that fails, opens it again for twice
// the period, up to MaxOpenTimeout. When too many of a service's instances
// are left out (see PanicThreshold), calls go to all of them, and the
// first that succeeds on an instance closes its breaker.
type BreakerConfig struct {
	// ConsecutiveFailures is the run of failures that opens the breaker.
	// Default 5.
	ConsecutiveFailures uint32
	// FailureRatio, when above zero, also opens the breaker once this
	// share of the calls counted in the current Window failed. Default 0:
	// off. Range 0 to 1.
	FailureRatio float64
	// MinRequests is the calls a Window must count before FailureRatio
	// applies. Default 20.
	MinRequests uint32
	// Window is the period after which a closed breaker forgets its
	// counts. Default 10 s.
	Window time.Duration
	// OpenTimeout is how long the breaker stays open the first time
	// before it sends the heartbeat. Default 5 s.
	OpenTimeout time.Duration
	// MaxOpenTimeout bounds the open period, which doubles each time the
	// breaker opens again: after a failed probe, or a trip within the
	// last open period's length after it closed. Default 60 s; never
	// below OpenTimeout.
	MaxOpenTimeout time.Duration
	// ProbeTimeout is how long the heartbeat that ends an open period may
	// take to be answered. Default 1 s.
	ProbeTimeout time.Duration
	// HalfOpenProbes is how many calls may probe a half-open instance at
	// once. Default 1.
	HalfOpenProbes uint32
	// PanicThreshold is the share of a service's instances whose breakers
	// must be open before balancing ignores the breakers. Default 1: only
	// when every instance is left out. Range 0 to 1; negative turns it off,
	// and calls then fail while every breaker is open.
	PanicThreshold float64
	// Disabled turns breaking off. Default false.
	Disabled bool
}

func (b BreakerConfig) withDefaults() BreakerConfig {
	if b.ConsecutiveFailures == 0 {
		b.ConsecutiveFailures = 5
	}
	if b.MinRequests == 0 {
		b.MinRequests = 20
	}
	if b.Window <= 0 {
		b.Window = 10 * time.Second
	}
	if b.OpenTimeout <= 0 {
		b.OpenTimeout = 5 * time.Second
	}
	if b.MaxOpenTimeout <= 0 {
		b.MaxOpenTimeout = 60 * time.Second
	}
	b.MaxOpenTimeout = max(b.MaxOpenTimeout, b.OpenTimeout)
	if b.ProbeTimeout <= 0 {
		b.ProbeTimeout = time.Second
	}
	if b.HalfOpenProbes == 0 {
		b.HalfOpenProbes = 1
	}
	if b.PanicThreshold == 0 || b.PanicThreshold > 1 {
		b.PanicThreshold = 1
	}
	return b
}

// breakers holds one breaker per instance address.
type breakers struct {
	cfg      BreakerConfig
	log      *slog.Logger
	observer Observer
	mu       sync.Mutex                                 // serialises creation
	m        atomic.Pointer[map[string]*instanceHealth] // copy on write
	// gen changes whenever a breaker trips, closes or goes: panic
	// verdicts computed under an older gen are stale.
	gen atomic.Uint64

	// ping sends the heartbeat that ends an open period (transport's
	// Pool.Ping); nil takes every heartbeat as answered.
	ping   func(ctx context.Context, addr string) error
	ctx    context.Context // ends with close, and the heartbeats with it
	cancel context.CancelFunc
	life   sync.Mutex // orders close against heartbeats starting
	// closing is set by close: no heartbeat starts after it.
	closing atomic.Bool
	wg      sync.WaitGroup // heartbeats in flight
}

// instanceHealth is what the client knows of one instance's health.
type instanceHealth struct {
	cb *gobreaker.CircuitBreaker[struct{}]
	// tripped is set while the breaker is not closed (OnStateChange).
	tripped atomic.Bool
	// latency feeds the adaptive per-try timeout.
	latency latencyPeak
	// failing is set while the breaker's run of consecutive failures may
	// be above zero; report serialises setting and clearing it.
	failing atomic.Bool
	report  sync.Mutex

	// admit is set while the breaker is not closed and the instance
	// answered the heartbeat: calls may probe it.
	admit atomic.Bool
	probe sync.Mutex // guards the fields below
	// period is the current open period, or the last one.
	period   time.Duration
	closedAt time.Time   // when the breaker last closed
	timer    *time.Timer // sends the heartbeat at the end of the period
	stopped  bool        // the breaker went, or the client closed
}

// quiet reports whether an attempt may bypass h's breaker: it is closed
// and has no failure in its run, so the attempt's success would change
// nothing and only its failure needs telling (fail). This costs two atomic
// loads, where the breaker takes its lock and reads the clock twice.
func (b *breakers) quiet(h *instanceHealth) bool {
	// With FailureRatio on, every attempt counts; without it the trip
	// depends on the run of failures alone.
	return b.cfg.FailureRatio <= 0 && !h.tripped.Load() && !h.failing.Load()
}

// fail tells h's breaker of a failure of an attempt that bypassed it.
// err is one that counts (countsAgainst).
func (h *instanceHealth) fail(err error) {
	h.report.Lock()
	defer h.report.Unlock()
	h.failing.Store(true)
	// The attempt began while the breaker was closed. A breaker that
	// tripped since ignores it, as it ignores the outcome of an attempt it
	// let through before it tripped: a half-open one would count it as
	// its probe.
	if h.tripped.Load() {
		return
	}
	_, _ = h.cb.Execute(func() (struct{}, error) { return struct{}{}, err })
}

// settle updates failing after an attempt that went through h's breaker,
// which ended with err (errDraining for a draining address).
func (h *instanceHealth) settle(err error) {
	switch {
	case countsAgainst(err):
		h.report.Lock()
		h.failing.Store(true)
		h.report.Unlock()
	case h.failing.Load() && !instanceFailure(err):
		h.report.Lock()
		// A failure told meanwhile is in the counts by now, or sets
		// failing after this: either way it is not lost.
		if h.cb.State() == gobreaker.StateClosed && h.cb.Counts().ConsecutiveFailures == 0 {
			h.failing.Store(false)
		}
		h.report.Unlock()
	}
}

func newBreakers(cfg BreakerConfig, log *slog.Logger, obs Observer) *breakers {
	b := &breakers{cfg: cfg.withDefaults(), log: log, observer: obs}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	empty := map[string]*instanceHealth{}
	b.m.Store(&empty)
	return b
}

// lookup returns the health of addr, and whether this call created it.
func (b *breakers) lookup(addr string) (*instanceHealth, bool) {
	if h := (*b.m.Load())[addr]; h != nil {
		return h, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	old := *b.m.Load()
	if h := old[addr]; h != nil {
		return h, false
	}
	cfg := b.cfg
	h := &instanceHealth{}
	h.cb = gobreaker.NewCircuitBreaker[struct{}](gobreaker.Settings{
		Name:        addr,
		MaxRequests: cfg.HalfOpenProbes,
		Interval:    cfg.Window,
		Timeout:     cfg.OpenTimeout,
		ReadyToTrip: func(c gobreaker.Counts) bool {
			if c.ConsecutiveFailures >= cfg.ConsecutiveFailures {
				return true
			}
			// gobreaker counts excluded calls (dial-backoff refusals,
			// shed calls, callers that gave up) in Requests: the ratio is
			// over the calls counted either way.
			counted := c.Requests - c.TotalExclusions
			return cfg.FailureRatio > 0 && counted >= cfg.MinRequests &&
				float64(c.TotalFailures) >= cfg.FailureRatio*float64(counted)
		},
		OnStateChange: func(name string, from, to gobreaker.State) {
			h.tripped.Store(to != gobreaker.StateClosed)
			b.gen.Add(1)
			admitted := h.admit.Load()
			switch to {
			case gobreaker.StateOpen:
				b.opened(h, from)
			case gobreaker.StateClosed:
				h.closed()
			case gobreaker.StateHalfOpen:
				// The breaker's own clock says so. The half-open that
				// counts begins when the instance answers the heartbeat,
				// which reports it.
				return
			}
			if to == gobreaker.StateOpen && from == gobreaker.StateHalfOpen && !admitted {
				// The heartbeat went unanswered: open it was, open it
				// stays, for longer.
				b.log.Info("dabb: circuit breaker stays open: no answer to a heartbeat", "addr", name, "for", h.openPeriod())
				return
			}
			b.log.Warn("dabb: circuit breaker", "addr", name, "from", from.String(), "to", to.String())
			if b.observer != nil {
				b.observer.BreakerChanged(name, from.String(), to.String())
			}
		},
		IsSuccessful: func(err error) bool { return !instanceFailure(err) && !errors.Is(err, errProbeFailed) },
		IsExcluded:   excludedFromBreaker,
	})
	next := make(map[string]*instanceHealth, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[addr] = h
	b.m.Store(&next)
	return h, true
}

// forget drops addr's breaker because a new server took the address over.
// The next call there starts a closed one. A breaker that was not closed
// is reported as closing.
func (b *breakers) forget(addr string) {
	h := b.drop(addr)
	if h == nil {
		return
	}
	if from := h.state(); from != gobreaker.StateClosed {
		b.log.Info("dabb: circuit breaker reset: a new server at the address", "addr", addr, "from", from.String())
		if b.observer != nil {
			b.observer.BreakerChanged(addr, from.String(), gobreaker.StateClosed.String())
		}
	}
}

// open reports whether addr's breaker takes no attempt now. It is open,
// half-open before its instance answered the heartbeat, or half-open with
// all its probes taken. The balancer then leaves the instance out rather
// than have the breaker refuse what it picked.
func (b *breakers) open(addr string) bool {
	if b.cfg.Disabled {
		return false
	}
	h := (*b.m.Load())[addr]
	// open runs for every candidate the balancer considers: a closed
	// breaker costs one atomic load, not the breaker's lock and the clock.
	if h == nil || !h.tripped.Load() {
		return false
	}
	if !h.admit.Load() {
		return true // no call until the instance answers the heartbeat
	}
	// An open breaker turns half-open lazily, when asked after its
	// timeout: State asks, for a breaker that is not closed.
	switch h.cb.State() {
	case gobreaker.StateOpen:
		return true
	case gobreaker.StateHalfOpen:
		// A probe whose outcome was excluded (the caller gave up, the
		// address is draining) frees its slot, as in gobreaker itself.
		n := h.cb.Counts()
		return n.Requests-min(n.Requests, n.TotalExclusions) >= b.cfg.HalfOpenProbes
	}
	return false
}

// drop removes addr's breaker, if any, and returns it. The address left
// every instance list, or a new server took it over (forget).
func (b *breakers) drop(addr string) *instanceHealth { return b.dropIf(addr, nil) }

// dropIf removes addr's breaker if it is want (any one, for nil) and
// returns what it removed.
func (b *breakers) dropIf(addr string, want *instanceHealth) *instanceHealth {
	b.mu.Lock()
	defer b.mu.Unlock()
	old := *b.m.Load()
	h := old[addr]
	if h == nil || want != nil && h != want {
		return nil
	}
	next := make(map[string]*instanceHealth, len(old))
	for k, v := range old {
		if k != addr {
			next[k] = v
		}
	}
	b.m.Store(&next)
	b.gen.Add(1)
	h.stop()
	return h
}

// tripped reports whether addr's breaker is not closed: the instance
// counts as ejected for the panic threshold, half-open or not.
func (b *breakers) tripped(addr string) bool {
	h := (*b.m.Load())[addr]
	return h != nil && h.tripped.Load()
}

// reset closes addr's breaker h after an attempt made in panic mode
// succeeded: the instance answers again. It drops h, so the next call
// there starts a closed breaker. A breaker replaced meanwhile is left be.
func (b *breakers) reset(addr string, h *instanceHealth) {
	if b.dropIf(addr, h) == nil {
		return // another call reset it first, or a new server took the address
	}
	from := h.state()
	b.log.Info("dabb: circuit breaker closed: the instance answered while its service was in panic", "addr", addr, "from", from.String())
	if b.observer != nil {
		b.observer.BreakerChanged(addr, from.String(), gobreaker.StateClosed.String())
	}
}

// BreakerState returns the breaker state of an instance address: "closed",
// "half-open" or "open". An address the client has not called is "closed".
func (c *Client) BreakerState(addr string) string {
	h := (*c.breakers.m.Load())[addr]
	if h == nil {
		return gobreaker.StateClosed.String()
	}
	return h.state().String()
}

// state returns h's breaker state as the client acts on it: half-open
// only once the instance answered the heartbeat.
func (h *instanceHealth) state() gobreaker.State {
	s := h.cb.State()
	if s == gobreaker.StateHalfOpen && !h.admit.Load() {
		return gobreaker.StateOpen
	}
	return s
}

// errBreakerOpen is the cause of the error for an attempt a breaker refused.
var errBreakerOpen = errors.New("proxy: circuit breaker open")

// instanceFailure reports whether err speaks of the instance's health.
func instanceFailure(err error) bool {
	pe := asError(err)
	if pe == nil || refused(pe) {
		// A refused caller met a server that answers: whatever the
		// status, its breaker counts a success.
		return false
	}
	if pe.Remote {
		return pe.Status == protocol.StatusServerError || pe.Status == protocol.StatusServerThreadpoolExhausted
	}
	switch pe.Status {
	case protocol.StatusChannelInactive, protocol.StatusServerTimeout:
		// A 31 counts whichever deadline ended the attempt. The breaker
		// cannot tell a slow instance from a tight deadline, and a hung
		// instance must open its breaker also for callers whose
		// contexts always carry deadlines.
		return true
	}
	return false
}

// countsAgainst reports whether err counts as a failure for a breaker: it
// speaks of the instance's health and is not excluded.
func countsAgainst(err error) bool { return instanceFailure(err) && !excludedFromBreaker(err) }

// errDraining stands, for the breaker, for a failure from an address that
// announced its shutdown (guarded).
var errDraining = errors.New("proxy: the address is shutting down")

// excludedFromBreaker reports errors that say nothing new of the
// instance's health. The caller gave up, the budget was spent before
// sending, the address announced its shutdown, the dial backoff refused
// the attempt, the server was closing the connection to make room, or the
// server shed the call.
func excludedFromBreaker(err error) bool {
	// A dial backoff touched no network: the dial that failed was counted.
	if errors.Is(err, errDraining) || errors.Is(err, transport.ErrDialBackoff) || errors.Is(err, transport.ErrGoneAway) {
		return true
	}
	pe := asError(err)
	if pe == nil {
		return false
	}
	if pe.Remote {
		// A shed call (100) comes from an overloaded instance, not a
		// failing one, and is answered at once. Opening its breaker
		// would turn a load spike into an outage of the instance. The
		// balancer still routes away from it.
		return pe.Status == protocol.StatusServerThreadpoolExhausted
	}
	return pe.Status == protocol.StatusClientError ||
		pe.Status == protocol.StatusClientTimeout && errors.Is(err, ErrNotSent)
}
