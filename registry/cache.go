// The client-side Cache of instances: lookups, the snapshot fallback, Stale, Suspect and Close.

package registry

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// EmptyProtection says what a Cache does with a push that would leave a
// service with no instances while the registry is up.
type EmptyProtection uint8

const (
	// ProtectEmpty, the default, keeps the last known instances and
	// marks them suspect (see [Cache.Suspect]) until a non-empty push
	// arrives. A registry that wrongly reports nothing then does not stop
	// every call; dead instances are left to the caller's breaker. A
	// service really scaled to zero therefore keeps its last instances.
	ProtectEmpty EmptyProtection = iota
	// AllowEmpty applies empty pushes like any other.
	AllowEmpty
)

// Defaults of CacheConfig.
const (
	DefaultInitialTimeout = 500 * time.Millisecond
	DefaultMinRetryDelay  = 100 * time.Millisecond
	DefaultMaxRetryDelay  = 10 * time.Second
)

// CacheConfig configures a Cache. The zero value works.
type CacheConfig struct {
	// EmptyProtection decides what an empty push does; the zero value,
	// ProtectEmpty, keeps the last known instances.
	EmptyProtection EmptyProtection
	// SnapshotPath, when set, names a file holding the last known
	// instances of every service, rewritten atomically on each change.
	// Caches and processes may share one: each write keeps the services
	// the writer does not follow as the file has them, and writers take
	// turns (a lock on the file's directory, on Unix).
	// A lookup that cannot reach the registry within InitialTimeout
	// falls back to it, so a process can start during an outage.
	SnapshotPath string
	// InitialTimeout bounds how long the first lookup of a service waits
	// for the registry before it falls back to the snapshot; default
	// 500 ms. A caller with less time left tries the snapshot after half
	// of it. When neither answers, the lookup fails with ErrUnavailable,
	// and so do later lookups of the service, at once, until the registry
	// lists it (the cache keeps trying meanwhile). The error says why:
	// the failed watch attempt's error, or, when none has failed yet,
	// that the registry could not be reached (a backend implementing
	// [Reachability] knows) or did not answer within InitialTimeout.
	InitialTimeout time.Duration
	// MinRetryDelay and MaxRetryDelay bound the backoff between watch
	// attempts while the registry is unreachable; defaults 100 ms, 10 s.
	MinRetryDelay, MaxRetryDelay time.Duration
	// Logger receives outage and recovery messages; nil means
	// slog.Default().
	Logger *slog.Logger
}

// Cache keeps the instances of the services a client calls. The first
// lookup of a service starts one watch for it; later lookups read memory
// only. When the registry is unreachable the cache keeps the last known
// instances (and says so: [Cache.Stale]) and retries the watch with
// backoff; a connection error never empties a service.
//
//	c := registry.NewCache(reg, registry.CacheConfig{SnapshotPath: "/var/lib/app/registry.json"})
//	defer c.Close()
//	ins, err := c.Instances(ctx, "inventory.Inventory")
//
// A Cache is safe for concurrent use.
type Cache struct {
	r      Registry
	cfg    CacheConfig
	log    *slog.Logger
	ctx    context.Context // ends at Close
	cancel context.CancelFunc
	work   tracker // the watch goroutines, loads and first calls of subscribers
	group  singleflight.Group
	closed atomic.Bool

	mu      sync.RWMutex // guards entries
	entries map[string]*cacheEntry

	snap snapshotStore
}

// cacheEntry is the state of one service.
type cacheEntry struct {
	service string
	state   atomic.Pointer[cacheState] // nil until the first list is known
	ready   chan struct{}              // closed when state is first set
	failed  chan struct{}              // closed at the first watch failure

	mu      sync.Mutex // guards following and writes of state
	lastErr error
	refused bool // the registry refused the service: lastErr wraps ErrInvalid; the watch has ended
	// gaveUp is the error of a first lookup that waited InitialTimeout
	// for the registry in vain, with no snapshot to fall back on: later
	// lookups fail at once with it until the registry lists the service.
	gaveUp     error
	failLogged bool
	subs       map[*subscription]struct{}
	watcher    Watcher // the registry watcher being followed, if any; Close stops it
}

// cacheState is immutable once stored.
type cacheState struct {
	instances []Instance
	version   uint64 // grows when instances change
	stale     bool   // the registry could not confirm instances
	suspect   bool   // kept despite an empty push
	snapshot  bool   // instances come from the snapshot file
}

// NewCache returns a cache over r. It does no I/O and starts no
// goroutine until the first lookup. Close stops it; it does not close r.
func NewCache(r Registry, cfg CacheConfig) *Cache {
	if cfg.InitialTimeout <= 0 {
		cfg.InitialTimeout = DefaultInitialTimeout
	}
	if cfg.MinRetryDelay <= 0 {
		cfg.MinRetryDelay = DefaultMinRetryDelay
	}
	if cfg.MaxRetryDelay <= 0 {
		cfg.MaxRetryDelay = DefaultMaxRetryDelay
	}
	cfg.MaxRetryDelay = max(cfg.MaxRetryDelay, cfg.MinRetryDelay)
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, cancel := context.WithCancel(context.Background())
	log := cfg.Logger.With("component", "registry.Cache")
	return &Cache{
		r:       r,
		cfg:     cfg,
		log:     log,
		ctx:     ctx,
		cancel:  cancel,
		work:    tracker{changed: make(chan struct{})},
		entries: make(map[string]*cacheEntry),
		snap:    snapshotStore{path: cfg.SnapshotPath, log: log},
	}
}

// Instances returns the instances of service, sorted by ID. The first call
// for a service waits for the registry (bounded by ctx and InitialTimeout,
// then the snapshot file is tried; see CacheConfig.InitialTimeout); later
// calls read memory only and do not allocate. The returned slice is
// shared: do not modify it, nor its Metadata maps.
//
// The result may be stale (the registry is unreachable) or suspect (kept
// despite an empty push); see Stale and Suspect. It is empty, with a nil
// error, when the registry says the service has no instances. The error
// wraps ErrInvalid when the name is invalid or the registry refuses it
// (then the cache does not watch it again), and ErrUnavailable when no
// instances are known and the registry does not answer.
func (c *Cache) Instances(ctx context.Context, service string) ([]Instance, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	c.mu.RLock()
	e := c.entries[service]
	c.mu.RUnlock()
	if e != nil {
		if st := e.state.Load(); st != nil {
			return st.instances, nil
		}
	}
	return c.slowInstances(ctx, service)
}

func (c *Cache) slowInstances(ctx context.Context, service string) ([]Instance, error) {
	if err := ValidateService(service); err != nil {
		return nil, fmt.Errorf("registry: cache: %w", err)
	}
	if err := c.gaveUp(service); err != nil {
		return nil, err
	}
	ch := c.group.DoChan(service, func() (any, error) { return c.load(service) })
	// A caller whose deadline is nearer than InitialTimeout tries the
	// snapshot after half of what it has left, so that a process started
	// during an outage can make calls with short timeouts.
	var early <-chan time.Time
	if d, ok := ctx.Deadline(); ok && c.cfg.SnapshotPath != "" {
		if wait := time.Until(d) / 2; wait < c.cfg.InitialTimeout {
			t := time.NewTimer(wait)
			defer t.Stop()
			early = t.C
		}
	}
	for {
		select {
		case res := <-ch:
			if res.Err != nil {
				return nil, res.Err
			}
			return res.Val.([]Instance), nil
		case <-early:
			early = nil
			if ins, ok := c.snapshotNow(service); ok {
				return ins, nil
			}
		case <-ctx.Done():
			return nil, fmt.Errorf("registry: cache: looking up %s: %w", service, ctx.Err())
		}
	}
}

// gaveUp returns the error of an earlier lookup of service that found the
// registry unreachable and no snapshot, while the registry still has not
// listed it (the watch goes on retrying meanwhile).
func (c *Cache) gaveUp(service string) error {
	c.mu.RLock()
	e := c.entries[service]
	c.mu.RUnlock()
	if e == nil {
		return nil
	}
	if err := e.refusal(); err != nil {
		return err // refused since: that error says more, and for good
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.state.Load() != nil {
		return nil
	}
	return e.gaveUp
}

// snapshotNow falls back to the snapshot for a lookup in progress (load
// has created the entry) whose caller cannot wait for InitialTimeout.
func (c *Cache) snapshotNow(service string) ([]Instance, bool) {
	if !c.work.enter() {
		return nil, false
	}
	defer c.work.exit()
	c.mu.RLock()
	e := c.entries[service]
	c.mu.RUnlock()
	if e == nil {
		return nil, false
	}
	return c.fromSnapshot(e)
}

// load waits for the first list of a service, falling back to the
// snapshot when the registry does not answer. It runs on a goroutine of
// its own and may call subscribers (with the snapshot's list): Close
// waits for it.
func (c *Cache) load(service string) ([]Instance, error) {
	if !c.work.enter() {
		return nil, ErrClosed
	}
	defer c.work.exit()
	e, err := c.entry(service)
	if err != nil {
		return nil, err
	}
	if st := e.state.Load(); st != nil {
		return st.instances, nil
	}
	timer := time.NewTimer(c.cfg.InitialTimeout)
	defer timer.Stop()
	failed := e.failed
	for {
		select {
		case <-e.ready:
			return e.state.Load().instances, nil
		case <-failed:
			failed = nil // try the snapshot now, else wait on
			if err := e.refusal(); err != nil {
				return nil, err
			}
			if ins, ok := c.fromSnapshot(e); ok {
				return ins, nil
			}
			continue
		case <-timer.C:
		case <-c.ctx.Done():
			return nil, ErrClosed
		}
		break
	}
	if err := e.refusal(); err != nil {
		return nil, err
	}
	if ins, ok := c.fromSnapshot(e); ok {
		return ins, nil
	}
	unreachable, noAnswer := c.noAnswer()
	e.mu.Lock()
	defer e.mu.Unlock()
	if st := e.state.Load(); st != nil {
		return st.instances, nil // the registry answered just now
	}
	lastErr := e.lastErr
	if lastErr == nil || unreachable {
		// A backend that knows it is cut off names the servers and why;
		// a watch attempt cut by the same loss ("connection closed")
		// says less.
		lastErr = noAnswer
	}
	e.gaveUp = fmt.Errorf("registry: cache: no instances of %s known: %w (%w) and no snapshot holds them", service, ErrUnavailable, lastErr)
	return nil, e.gaveUp
}

// noAnswer says why the watch gave no list within InitialTimeout: the
// registry cannot be reached, when the backend can tell (Reachability;
// unreachable is then true), else it is slow to answer.
func (c *Cache) noAnswer() (unreachable bool, why error) {
	if r, ok := c.r.(Reachability); ok {
		if err := r.Unreachable(); err != nil {
			return true, fmt.Errorf("the registry could not be reached in %v: %w", c.cfg.InitialTimeout, err)
		}
	}
	return false, fmt.Errorf("no answer within %v", c.cfg.InitialTimeout)
}

// refusal returns the error of a registry that refused the service, for
// good.
func (e *cacheEntry) refusal() error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.refused {
		return nil
	}
	return fmt.Errorf("registry: cache: watching %s: %w", e.service, e.lastErr)
}

// fromSnapshot installs the snapshot's instances of e's service, unless
// the registry answered meanwhile.
func (c *Cache) fromSnapshot(e *cacheEntry) ([]Instance, bool) {
	ins, ok := c.snap.lookup(e.service)
	if !ok {
		return nil, false
	}
	e.mu.Lock()
	if st := e.state.Load(); st != nil {
		e.mu.Unlock()
		return st.instances, true
	}
	st := &cacheState{instances: ins, version: 1, stale: true, snapshot: true}
	e.state.Store(st)
	close(e.ready)
	e.mu.Unlock()
	c.log.Warn("registry unreachable; using the snapshot file", "service", e.service, "instances", len(ins), "path", c.cfg.SnapshotPath)
	e.publish(st)
	return ins, true
}

// entry returns the entry of service, creating it and starting its watch
// when there is none.
func (c *Cache) entry(service string) (*cacheEntry, error) {
	if c.closed.Load() {
		return nil, ErrClosed
	}
	c.mu.RLock()
	e := c.entries[service]
	c.mu.RUnlock()
	if e != nil {
		return e, nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		return nil, ErrClosed
	}
	if e = c.entries[service]; e != nil {
		return e, nil
	}
	e = &cacheEntry{
		service: service,
		ready:   make(chan struct{}),
		failed:  make(chan struct{}),
		subs:    make(map[*subscription]struct{}),
	}
	if !c.work.enter() {
		return nil, ErrClosed
	}
	c.entries[service] = e
	go c.watch(e)
	return e, nil
}

// Stale reports whether the cache holds instances of service that the
// registry could not confirm lately. The registry is unreachable or
// refuses the service, or the instances came from the snapshot file and
// the registry has not listed them since. It is false for a service never
// looked up.
func (c *Cache) Stale(service string) bool {
	st := c.state(service)
	return st != nil && st.stale
}

// Suspect reports whether the instances of service were kept despite a
// push that would have emptied them (see ProtectEmpty).
func (c *Cache) Suspect(service string) bool {
	st := c.state(service)
	return st != nil && st.suspect
}

func (c *Cache) state(service string) *cacheState {
	c.mu.RLock()
	e := c.entries[service]
	c.mu.RUnlock()
	if e == nil {
		return nil
	}
	return e.state.Load()
}

// Close stops every watch and waits for the cache's goroutines to end.
// It does not wait for those inside a subscriber's call, so a subscriber
// may call Close. They end when the call returns, without touching the
// registry or the snapshot file again. No subscriber is called once Close
// has begun. Later lookups return ErrClosed. It does not close the
// registry.
func (c *Cache) Close() error {
	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		return ErrClosed
	}
	c.closed.Store(true)
	entries := make([]*cacheEntry, 0, len(c.entries))
	for _, e := range c.entries {
		entries = append(entries, e)
	}
	c.mu.Unlock()
	c.work.close()
	c.cancel()
	// A watch goroutine inside a subscriber's call is not waited for:
	// its registry watcher is stopped here, so it touches neither the
	// registry nor the snapshot file once the call returns.
	for _, e := range entries {
		e.mu.Lock()
		w := e.watcher
		e.watcher = nil
		e.mu.Unlock()
		if w != nil {
			w.Stop()
		}
	}
	c.work.wait()
	return nil
}
