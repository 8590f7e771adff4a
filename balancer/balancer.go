// The Balancer interface, New by name, and the picker every policy shares.

package balancer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

// Balancer chooses the instance that takes one attempt of a call.
//
// Update is called from one goroutine at a time, whenever the instance list
// changes. It builds an immutable picker and publishes it atomically. Pick
// and PickExcept never block and allocate nothing. They take no lock,
// except round robin over weights whose cycle is too long to precompute.
// Any number of goroutines may call them, also while Update runs. Their
// ctx is not consulted today; it is there for request-scoped routing.
type Balancer interface {
	// Update replaces the instances to choose from. The balancer copies
	// the slice (not the Metadata maps); the caller may reuse it. Load
	// figures of instances that stay (same ID and Addr) survive.
	Update(instances []registry.Instance)
	// Pick chooses an instance for the first attempt of a call. key is
	// the call's hash key: the consistent hash balancer routes on it, the
	// others ignore it. It returns an error wrapping ErrNoInstance when
	// there is no instance or every one is unavailable. done is never
	// nil. Call it exactly once when the attempt ends, also when Pick
	// failed (it then does nothing). An attempt whose done is never
	// called stays counted in flight.
	Pick(ctx context.Context, key string) (in registry.Instance, done Done, err error)
	// PickExcept is Pick for a retry: it also skips every instance whose
	// Addr is in tried, the addresses this call has already attempted.
	// When nothing else is left it returns an error wrapping
	// ErrNoInstance; the caller may then Pick again without exclusions if
	// it wants to try the same instance twice. tried is only read; keep it
	// in a small array on the call so that a retry allocates nothing.
	PickExcept(ctx context.Context, key string, tried []string) (in registry.Instance, done Done, err error)
}

// Done reports the end of one attempt: its latency, and err, nil on
// success. Pass an error only when the instance failed: no connection, a
// timeout, overload. An application error from a method that ran is not
// one. The least-active and p2c balancers rate the instance by it.
type Done func(latency time.Duration, err error)

// ErrNoInstance is wrapped by the error Pick returns when it has no
// instance to offer.
var ErrNoInstance = errors.New("balancer: no instance available")

// The names New accepts.
const (
	// Random picks at random in proportion to the instances' weights.
	Random = "random"
	// RoundRobin cycles through the instances, smooth-weighted.
	RoundRobin = "round_robin"
	// LeastActive picks the instance with the fewest calls in flight.
	LeastActive = "least_active"
	// ConsistentHash routes equal keys to the same instance.
	ConsistentHash = "consistent_hash"
	// P2C compares two random instances by latency and load: power of two
	// choices over a time-decayed peak EWMA.
	P2C = "p2c"
)

// Default is the balancer New builds for the empty name.
const Default = P2C

// Defaults of the p2c tuning fields of Config.
const (
	// DefaultDecayTime is the default Config.DecayTime.
	DefaultDecayTime = 10 * time.Second
	// DefaultErrorPenalty is the default Config.ErrorPenalty.
	DefaultErrorPenalty = 100 * time.Millisecond
)

// Config configures a Balancer. The zero value works.
type Config struct {
	// Available reports whether an instance may be chosen now: its
	// circuit breaker is not open and it did not announce that it is
	// shutting down. Nil means every instance is. It runs on the pick
	// path, possibly several times per pick and from many goroutines: it
	// must be cheap, lock-free, and must neither modify nor keep in.
	Available func(in *registry.Instance) bool
	// DecayTime is the time constant of the p2c latency average: an
	// observation's influence falls to 1/e after it (default 10 s).
	DecayTime time.Duration
	// ErrorPenalty is the least latency a failed attempt counts as in the
	// p2c average (default 100 ms), so that an instance failing fast does
	// not look fast. Set it well above the service's normal latency.
	ErrorPenalty time.Duration
}

// maxWeight bounds an instance's weight so that sums cannot overflow.
const maxWeight = 1_000_000

// kind is an algorithm.
type kind uint8

const (
	kindRandom kind = iota
	kindRoundRobin
	kindLeastActive
	kindConsistentHash
	kindP2C
)

var kinds = map[string]kind{
	Random:         kindRandom,
	RoundRobin:     kindRoundRobin,
	LeastActive:    kindLeastActive,
	ConsistentHash: kindConsistentHash,
	P2C:            kindP2C,
}

// hooks are the clock and random source; tests replace them.
type hooks struct {
	now  func() int64 // monotonic nanoseconds
	rand func() uint64
}

func defaultHooks() hooks {
	start := time.Now()
	return hooks{
		now:  func() int64 { return int64(time.Since(start)) },
		rand: rand.Uint64,
	}
}

// New returns the balancer called name (one of Random, RoundRobin,
// LeastActive, ConsistentHash, P2C; "" means Default). Until the first
// Update it has no instance.
func New(name string, cfg Config) (Balancer, error) {
	b, err := build(name, cfg, defaultHooks())
	if err != nil {
		return nil, err
	}
	return b, nil
}

func build(name string, cfg Config, h hooks) (*balancer, error) {
	if name == "" {
		name = Default
	}
	k, ok := kinds[name]
	if !ok {
		names := make([]string, 0, len(kinds))
		for n := range kinds {
			names = append(names, n)
		}
		sort.Strings(names)
		return nil, fmt.Errorf("balancer: unknown balancer %q (valid: %s): %w", name, strings.Join(names, ", "), registry.ErrInvalid)
	}
	if cfg.DecayTime < 0 || cfg.ErrorPenalty < 0 {
		return nil, fmt.Errorf("balancer: negative DecayTime (%v) or ErrorPenalty (%v)", cfg.DecayTime, cfg.ErrorPenalty)
	}
	if cfg.DecayTime == 0 {
		cfg.DecayTime = DefaultDecayTime
	}
	if cfg.ErrorPenalty == 0 {
		cfg.ErrorPenalty = DefaultErrorPenalty
	}
	b := &balancer{kind: k, cfg: cfg, hooks: h}
	if k == kindLeastActive || k == kindP2C {
		b.states = map[stateKey]*state{}
	}
	return b, nil
}

// balancer implements Balancer for every algorithm; the picker holds what
// differs.
type balancer struct {
	kind kind
	cfg  Config
	hooks

	mu     sync.Mutex             // serialises Update
	states map[stateKey]*state    // least active and p2c; guarded by mu
	cur    atomic.Pointer[picker] // nil until the first Update
}

// stateKey identifies an instance across updates.
type stateKey struct{ id, addr string }

// state is the load of one instance, shared by every picker that lists it
// and by the Done functions handed out for it.
type state struct {
	inflight atomic.Int64
	// ewma is the p2c latency estimate in nanoseconds as float64 bits;
	// negative until the first observation. stamp is when it was last
	// updated (hooks.now). Written under mu (stamp first), read without it
	// (ewma first): a reader may pair the old ewma with the new stamp,
	// which only under-decays the old estimate for an instant.
	ewma  atomic.Uint64
	stamp atomic.Int64
	mu    sync.Mutex
	done  Done
	_     [24]byte // 64 bytes: states of different instances share no cache line
}

// errEmpty is returned when the list is empty or Update was never called.
var errEmpty = fmt.Errorf("%w: the instance list is empty", ErrNoInstance)

// noop is the Done of balancers that need no feedback, and of failed picks.
func noop(time.Duration, error) {}

// Update implements Balancer.
func (b *balancer) Update(list []registry.Instance) {
	b.mu.Lock()
	defer b.mu.Unlock()
	p := &picker{
		kind:  b.kind,
		avail: b.cfg.Available,
		hooks: b.hooks,
		tau:   float64(b.cfg.DecayTime),
		ins:   append([]registry.Instance(nil), list...),
	}
	p.init()
	if b.states != nil {
		p.sorted = sortedByKey(p.ins)
		if old := b.cur.Load(); old != nil && old.sorted && p.sorted {
			b.mergeStates(p, old)
		} else {
			b.mapStates(p)
		}
	}
	b.cur.Store(p)
}

// mapStates gives p the states of its instances, found in b.states by
// key, and makes b.states hold those keys alone.
func (b *balancer) mapStates(p *picker) {
	p.states = make([]*state, len(p.ins))
	next := make(map[stateKey]*state, len(p.ins))
	for i := range p.ins {
		k := stateKey{p.ins[i].ID, p.ins[i].Addr}
		st := next[k]
		if st == nil {
			st = b.states[k]
		}
		if st == nil {
			st = b.newState()
		}
		next[k] = st
		p.states[i] = st
	}
	b.states = next
}

// mergeStates is mapStates for p and old both sorted by key: side by side,
// it takes the states of the instances that stay from old and touches
// b.states only for the keys added or removed.
func (b *balancer) mergeStates(p, old *picker) {
	p.states = make([]*state, len(p.ins))
	i := 0 // in old.ins
	for j := range p.ins {
		in := &p.ins[j]
		if j > 0 && sameKey(&p.ins[j-1], in) {
			p.states[j] = p.states[j-1] // duplicates share a state
			continue
		}
		// Equal strings are mostly the same strings, shared by the lists
		// the registry delivers: == ends at their pointers.
		found := false
		for i < len(old.ins) {
			if found = sameKey(&old.ins[i], in); found || registry.CompareInstances(old.ins[i], *in) > 0 {
				break
			}
			delete(b.states, stateKey{old.ins[i].ID, old.ins[i].Addr}) // gone
			i++
		}
		if found {
			p.states[j] = old.states[i]
			for i++; i < len(old.ins) && sameKey(&old.ins[i], in); i++ {
			}
			continue
		}
		st := b.newState()
		b.states[stateKey{in.ID, in.Addr}] = st
		p.states[j] = st
	}
	for ; i < len(old.ins); i++ {
		delete(b.states, stateKey{old.ins[i].ID, old.ins[i].Addr})
	}
}

// sameKey reports whether a and b have the same ID and Addr.
func sameKey(a, b *registry.Instance) bool { return a.ID == b.ID && a.Addr == b.Addr }

// sortedByKey reports whether list is sorted by ID, then Addr, as the
// registry cache delivers it; equal keys may repeat.
func sortedByKey(list []registry.Instance) bool {
	for i := 1; i < len(list); i++ {
		if registry.CompareInstances(list[i-1], list[i]) > 0 {
			return false
		}
	}
	return true
}

func (b *balancer) newState() *state {
	st := &state{}
	if b.kind == kindP2C {
		st.ewma.Store(unobserved)
		penalty := float64(b.cfg.ErrorPenalty)
		tau := float64(b.cfg.DecayTime)
		now := b.now
		st.done = func(latency time.Duration, err error) {
			st.observe(float64(latency), err != nil, penalty, tau, now)
			st.inflight.Add(-1)
		}
	} else {
		st.done = func(time.Duration, error) { st.inflight.Add(-1) }
	}
	return st
}

// Pick implements Balancer.
func (b *balancer) Pick(ctx context.Context, key string) (registry.Instance, Done, error) {
	return b.PickExcept(ctx, key, nil)
}

// PickExcept implements Balancer.
func (b *balancer) PickExcept(_ context.Context, key string, tried []string) (registry.Instance, Done, error) {
	p := b.cur.Load()
	if p == nil || len(p.ins) == 0 {
		return registry.Instance{}, noop, errEmpty
	}
	var i int
	var err error
	switch p.kind {
	case kindRandom:
		i, err = p.pickWeighted(tried)
	case kindRoundRobin:
		i, err = p.pickRoundRobin(tried)
	case kindLeastActive:
		i, err = p.pickLeastActive(tried)
	case kindConsistentHash:
		i, err = p.pickHash(key, tried)
	default:
		i, err = p.pickP2C(tried)
	}
	if err != nil {
		return registry.Instance{}, noop, err
	}
	if p.states == nil {
		return p.ins[i], noop, nil
	}
	st := p.states[i]
	st.inflight.Add(1)
	return p.ins[i], st.done, nil
}

// picker is the immutable snapshot one Update builds. Only the round robin
// cursor and current weights change after publication.
type picker struct {
	kind  kind
	avail func(*registry.Instance) bool
	hooks
	tau float64 // p2c decay time, nanoseconds

	ins     []registry.Instance
	weights []uint64
	states  []*state // least active and p2c
	sorted  bool     // ins is sorted by ID, then Addr; least active and p2c
	cum     []uint64 // prefix sums of weights
	total   uint64
	uniform bool // all weights equal

	errUnavailable error // every instance unavailable
	errSkipped     error // every instance unavailable or already tried

	rr   roundRobin
	ring ring
}

func (p *picker) init() {
	n := len(p.ins)
	p.weights = make([]uint64, n)
	p.cum = make([]uint64, n)
	p.uniform = true
	for i := range p.ins {
		w := uint64(min(p.ins[i].EffectiveWeight(), maxWeight))
		p.weights[i] = w
		p.total += w
		p.cum[i] = p.total
		if w != p.weights[0] {
			p.uniform = false
		}
	}
	of := ""
	if n > 0 && p.ins[0].Service != "" {
		of = " of " + p.ins[0].Service
	}
	all := fmt.Sprintf("all %d instances%s are", n, of)
	if n == 1 {
		all = "the only instance" + of + " is"
	}
	p.errUnavailable = fmt.Errorf("%w: %s unavailable", ErrNoInstance, all)
	p.errSkipped = fmt.Errorf("%w: %s unavailable or already tried", ErrNoInstance, all)
	switch p.kind {
	case kindRoundRobin:
		p.rr.init(p.weights, p.rand)
	case kindConsistentHash:
		p.ring.init(p.ins, p.weights)
	}
}

// usable reports whether instance i may take the attempt.
func (p *picker) usable(i int, tried []string) bool {
	in := &p.ins[i]
	for _, a := range tried {
		if a == in.Addr {
			return false
		}
	}
	return p.avail == nil || p.avail(in)
}

// none is the error when every instance was skipped.
func (p *picker) none(tried []string) error {
	if len(tried) > 0 {
		return p.errSkipped
	}
	return p.errUnavailable
}

// anyUsable reports whether at least one instance may take the attempt.
func (p *picker) anyUsable(tried []string) bool {
	for i := range p.ins {
		if p.usable(i, tried) {
			return true
		}
	}
	return false
}
