// Package static is an in-memory [registry.Registry]: a fixed list of
// addresses for clients that need no discovery, and the test double for
// everything above the registry.
//
// A fixed list that every service resolves to:
//
//	r := static.New(registry.Instance{Addr: "127.0.0.1:20880"})
//	// or: registry.Open(ctx, "static://127.0.0.1:20880,127.0.0.1:20881")
//
// In tests, servers Register into and clients Watch the same *Registry;
// Register and Deregister wake every watcher of the service:
//
//	r := static.New()
//	r.Register(ctx, registry.Instance{Service: "inventory.Inventory", ID: "a", Addr: addr})
//	w, _ := r.Watch(ctx, "inventory.Inventory")
//	set, _ := w.Next(ctx) // [{inventory.Inventory a addr}]
package static

import (
	"context"
	"fmt"
	"maps"
	"net/url"
	"sync"

	"github.com/dabbrpc/dabb/registry"
)

func init() {
	registry.RegisterScheme("static", open)
}

// open serves static://addr1,addr2: every service resolves to those
// addresses, each an Instance whose ID is its address.
func open(_ context.Context, u *url.URL, _ registry.OpenConfig) (registry.Registry, error) {
	hosts := registry.HostsOf(u)
	if len(hosts) == 0 {
		return nil, fmt.Errorf("static: URL has no addresses (want static://host:port,host:port): %w", registry.ErrInvalid)
	}
	ins := make([]registry.Instance, 0, len(hosts))
	for _, h := range hosts {
		in := registry.Instance{Service: "any", ID: h, Addr: h}
		if err := in.Validate(); err != nil {
			return nil, fmt.Errorf("static: %w", err)
		}
		in.Service = ""
		ins = append(ins, in)
	}
	return New(ins...), nil
}

// Registry is an in-memory registry. Its zero value is not usable; call New.
type Registry struct {
	mu       sync.Mutex // guards following
	closed   bool
	services map[string]map[string]registry.Instance // service -> id -> instance
	fixed    []registry.Instance                     // instances of every service
	changed  chan struct{}                           // closed and replaced on every change
}

var _ registry.Registry = (*Registry)(nil)

// New returns a registry holding the given instances. An instance with an
// empty Service belongs to every service: Watch(s) returns it with Service
// set to s. An instance with an empty ID gets its Addr as ID.
func New(instances ...registry.Instance) *Registry {
	r := &Registry{
		services: make(map[string]map[string]registry.Instance),
		changed:  make(chan struct{}),
	}
	for _, in := range instances {
		if in.ID == "" {
			in.ID = in.Addr
		}
		in.Metadata = maps.Clone(in.Metadata)
		if in.Service == "" {
			r.fixed = append(r.fixed, in)
			continue
		}
		r.put(in)
	}
	return r
}

func (r *Registry) put(in registry.Instance) {
	m := r.services[in.Service]
	if m == nil {
		m = make(map[string]registry.Instance)
		r.services[in.Service] = m
	}
	m[in.ID] = in
}

// notify wakes every watcher; r.mu must be held.
func (r *Registry) notify() {
	close(r.changed)
	r.changed = make(chan struct{})
}

// Register adds the instance, or replaces the one with the same service
// and ID, and wakes the service's watchers.
func (r *Registry) Register(ctx context.Context, in registry.Instance) error {
	if err := in.Validate(); err != nil {
		return fmt.Errorf("static: register: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("static: register %s/%s: %w", in.Service, in.ID, err)
	}
	in.Metadata = maps.Clone(in.Metadata)
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return registry.ErrClosed
	}
	r.put(in)
	r.notify()
	return nil
}

// Deregister removes the instance with the same service and ID, if any,
// and wakes the service's watchers.
func (r *Registry) Deregister(ctx context.Context, in registry.Instance) error {
	if err := registry.ValidateService(in.Service); err != nil {
		return fmt.Errorf("static: deregister: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("static: deregister %s/%s: %w", in.Service, in.ID, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return registry.ErrClosed
	}
	m := r.services[in.Service]
	if _, ok := m[in.ID]; !ok {
		return nil
	}
	delete(m, in.ID)
	if len(m) == 0 {
		delete(r.services, in.Service)
	}
	r.notify()
	return nil
}

// Watch follows one service. The first Next returns the current set.
func (r *Registry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	if err := registry.ValidateService(service); err != nil {
		return nil, fmt.Errorf("static: watch: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("static: watch %s: %w", service, err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, registry.ErrClosed
	}
	return &watcher{r: r, service: service, stop: make(chan struct{})}, nil
}

// Close removes every instance and ends every watch: their Next returns
// registry.ErrClosed. Later calls return registry.ErrClosed.
func (r *Registry) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return registry.ErrClosed
	}
	r.closed = true
	r.services = nil
	r.fixed = nil
	r.notify()
	return nil
}

// snapshot returns the current set of a service, sorted by ID, and a
// channel closed at the next change.
func (r *Registry) snapshot(service string) ([]registry.Instance, <-chan struct{}, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, registry.ErrClosed
	}
	m := r.services[service]
	set := make([]registry.Instance, 0, len(m)+len(r.fixed))
	for _, in := range m {
		in.Metadata = maps.Clone(in.Metadata)
		set = append(set, in)
	}
	for _, in := range r.fixed {
		if _, shadowed := m[in.ID]; shadowed {
			continue
		}
		in.Service = service
		in.Metadata = maps.Clone(in.Metadata)
		set = append(set, in)
	}
	return registry.SortedCopy(set), r.changed, nil
}

type watcher struct {
	r        *Registry
	service  string
	stop     chan struct{}
	stopOnce sync.Once

	mu      sync.Mutex // guards following
	started bool
	last    []registry.Instance
}

// Next returns the current set at once on its first call, then blocks
// until the set differs from the one it last returned.
func (w *watcher) Next(ctx context.Context) ([]registry.Instance, error) {
	return registry.WaitNext(ctx, w.stop, w.poll)
}

// poll returns what Next returns now, or the channel closed at the next
// change when that is nothing yet.
func (w *watcher) poll() ([]registry.Instance, <-chan struct{}, error) {
	set, changed, err := w.r.snapshot(w.service)
	if err != nil {
		return nil, nil, err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.started || !registry.EqualSets(set, w.last) {
		w.started, w.last = true, set
		return registry.CloneSet(set), nil, nil
	}
	return nil, changed, nil
}

// Stop ends the watch; a blocked Next returns registry.ErrWatcherStopped.
func (w *watcher) Stop() {
	w.stopOnce.Do(func() { close(w.stop) })
}
