// Client, NewClient, Invoke, and the state the client keeps per service.

package proxy

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/codec"
	_ "github.com/dabbrpc/dabb/codec/proto" // the default codec
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// Client calls services found through a registry. It is safe for concurrent
// use; make one per process and share it.
//
//	c, err := proxy.NewClient(reg)
//	if err != nil {
//		return err
//	}
//	defer c.Close()
//	inv := inventory.NewInventoryClient(c)
//	reply, err := inv.Deduct(ctx, &pb.DeductRequest{Sku: "sku-42", Count: 1})
type Client struct {
	opts     options
	reg      registry.Registry
	codec    codec.Codec
	pool     *transport.Pool
	cache    *registry.Cache
	breakers *breakers
	budget   *retryBudget
	invoke   Invoker
	calls    sync.Pool // *Call
	reqs     sync.Pool // *outgoing
	closed   atomic.Bool

	svcMu    sync.Mutex                               // serialises creation of services
	services atomic.Pointer[map[string]*serviceState] // copy on write

	addrMu   sync.Mutex          // guards addrs and tlsNames
	addrs    map[string]*listing // service: what it lists now
	tlsNames map[string]string   // address: its MetadataTLSServerName value

	keyPrefix string        // random, per client: idempotency keys
	keySeq    atomic.Uint64 // idempotency key counter

	described describeCache // Describe's descriptions, by service
}

// NewClient returns a client that finds instances through r. It does no
// I/O: connections and registry watches start with the first call. Close
// the client when done; r stays the caller's to close.
//
// NewClient fails for a codec that is not registered (the error wraps
// codec.ErrUnknown) and for an unknown balancer name (it wraps
// registry.ErrInvalid). The error names the option at fault.
func NewClient(r registry.Registry, opts ...Option) (*Client, error) {
	c := &Client{opts: defaultOptions(), reg: r}
	for _, o := range opts {
		o(&c.opts)
	}
	var err error
	if c.codec, err = codec.ByName(c.opts.codec); err != nil {
		return nil, fmt.Errorf("proxy: WithCodec(%q): %w", c.opts.codec, err)
	}
	for _, name := range c.balancerNames() {
		if _, err := balancer.New(name, balancer.Config{}); err != nil {
			return nil, fmt.Errorf("proxy: WithBalancer(%q): %w", name, err)
		}
	}
	if c.opts.logger == nil {
		c.opts.logger = slog.Default()
	}
	if c.opts.transport.Logger == nil {
		c.opts.transport.Logger = c.opts.logger
	}
	if c.opts.cache.Logger == nil {
		c.opts.cache.Logger = c.opts.logger
	}
	onBack := c.opts.transport.OnBack
	c.opts.transport.OnBack = func(addr string) {
		// A server restarted at an address that shut down is a new
		// process: the old one's breaker history is not its own.
		c.breakers.forget(addr)
		if onBack != nil {
			onBack(addr)
		}
	}
	c.opts.transport.ServerName = c.serverName(c.opts.transport.ServerName)
	if c.opts.transport.Serializations == nil {
		c.opts.transport.Serializations = codec.Known
	}
	c.pool = transport.NewPool(c.opts.transport)
	c.cache = registry.NewCache(r, c.opts.cache)
	c.opts.retry = c.opts.retry.withDefaults()
	c.budget = newRetryBudget(c.opts.retry.BudgetRatio, c.opts.retry.BudgetFloor)
	c.breakers = newBreakers(c.opts.breaker, c.opts.logger, c.opts.observer)
	c.breakers.ping = c.pool.Ping
	empty := map[string]*serviceState{}
	c.services.Store(&empty)
	c.keyPrefix = strconv.FormatUint(rand.Uint64(), 36) + "-"
	c.calls.New = func() any { return new(Call) }
	c.reqs.New = func() any { return new(outgoing) }
	c.invoke = Chain(c.opts.middleware...)(c.run)
	return c, nil
}

// balancerNames returns the balancer names the options give, once each.
func (c *Client) balancerNames() []string {
	names := []string{c.opts.balancer}
	for _, n := range c.opts.balancers {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	return names
}

// Close closes the client's connections and watches. Calls in flight fail.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
	}
	for _, st := range *c.services.Load() {
		st.unsub()
	}
	c.cache.Close()
	c.breakers.close()
	return c.pool.Close()
}

// Invoke calls service.method with req and decodes the reply into resp.
// Options apply in this order, later ones winning: opts (the stub's, from
// the interface's directives), the client's WithMethodTimeout, then those
// on ctx from WithCallOptions. ctx's deadline wins over a later timeout.
func (c *Client) Invoke(ctx context.Context, service, method string, req, resp any, opts ...CallOption) error {
	// A pooled call is zero but for its Attachments map, emptied: kept
	// across calls, so attachments cost no map. Setting the fields one by
	// one writes only them; assigning a whole Call copied all of it.
	call := c.calls.Get().(*Call)
	clear(call.Attachments)
	call.Service, call.Method, call.Req, call.Resp = service, method, req, resp
	call.Timeout, call.codec = c.opts.timeout, c.codec
	for _, o := range opts {
		o.apply(call)
	}
	if c.opts.methods != nil {
		if d, ok := c.opts.methods[methodKey{service, method}]; ok {
			call.Timeout = d
		}
	}
	if ctxOpts, ok := ctx.Value(callOptionsKey{}).([]CallOption); ok {
		for _, o := range ctxOpts {
			o.apply(call)
		}
	}
	call.start = time.Now()
	call.Deadline = call.start.Add(call.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(call.Deadline) {
		call.Deadline = dl
	}
	var err error
	switch {
	case c.closed.Load():
		err = protocol.NotSent(protocol.StatusClientError, "client closed", protocol.ErrCanceled)
	default:
		if err = c.invoke(ctx, call); err != nil {
			err = asCallError(err)
		}
	}
	*call = Call{Attachments: call.Attachments}
	c.calls.Put(call)
	return err
}

// Instances returns the instances of service the client currently knows,
// loading them on first use.
func (c *Client) Instances(ctx context.Context, service string) ([]registry.Instance, error) {
	return c.cache.Instances(ctx, service)
}

// Registry returns the registry the client finds instances through, as
// NewClient was given it. It stays the caller's to close.
func (c *Client) Registry() registry.Registry { return c.reg }

// Stale reports whether the client calls service on instances the
// registry has not confirmed lately. The registry is unreachable, or they
// came from the snapshot file. Calls go on; a health check may say so. See
// registry.Cache.Stale.
func (c *Client) Stale(service string) bool { return c.cache.Stale(service) }

// Suspect reports whether the instances of service were kept despite a
// registry answer that would have emptied them. See ProtectEmpty in
// registry.CacheConfig, and registry.Cache.Suspect.
func (c *Client) Suspect(service string) bool { return c.cache.Suspect(service) }

// serviceState is what the client keeps per service it calls: the
// balancer, which the registry cache feeds, and its panic verdict.
type serviceState struct {
	bal   balancer.Balancer
	unsub func()
	// ins is the list now, the cache's: read-only.
	ins atomic.Pointer[[]registry.Instance]
	// panic memoises panicking: breakers.gen<<1, plus 1 when panicking.
	panic atomic.Uint64
}

// service returns the state of a service, creating it on the first call.
// It then loads the instances, builds the balancer and subscribes it to
// changes, all before deadline.
func (c *Client) service(ctx context.Context, name string, deadline time.Time) (*serviceState, error) {
	if st := (*c.services.Load())[name]; st != nil {
		return st, nil
	}
	// The first lookup may wait for the registry: within the call's
	// budget, like everything the call does.
	lctx, cancel := context.WithDeadline(ctx, deadline)
	_, err := c.cache.Instances(lctx, name)
	cancel()
	if err != nil {
		return nil, err
	}
	c.svcMu.Lock()
	defer c.svcMu.Unlock()
	old := *c.services.Load()
	if st := old[name]; st != nil {
		return st, nil
	}
	kind := c.opts.balancer
	if k, ok := c.opts.balancers[name]; ok {
		kind = k
	}
	st := &serviceState{}
	bal, err := balancer.New(kind, balancer.Config{Available: func(in *registry.Instance) bool {
		return c.available(st, in)
	}})
	if err != nil {
		return nil, err
	}
	st.bal = bal
	unsub, err := c.cache.Subscribe(name, func(ins []registry.Instance) { c.onList(name, st, ins) })
	if err != nil {
		return nil, err
	}
	st.unsub = unsub
	next := make(map[string]*serviceState, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = st
	c.services.Store(&next)
	return st, nil
}

// onList takes a new list of the instances of service, whose state is st.
// A list sorted by ID, as the cache delivers it, costs the instances that
// came, went or changed, and one pass of mostly pointer comparisons.
func (c *Client) onList(service string, st *serviceState, ins []registry.Instance) {
	d := c.diff(service, ins)
	c.noteTLSNames(d.came) // before the balancer may pick a new instance
	c.noteTLSNames(d.retagged)
	st.ins.Store(&ins)
	c.breakers.gen.Add(1) // the panic verdict is over the new list
	st.bal.Update(ins)
	c.apply(service, ins, d)
}

// listing is what a service lists now: its instances, and how many of
// them are at each address.
type listing struct {
	ins    []registry.Instance
	sorted bool // ins is strictly sorted by ID
	addrs  map[string]int
}

// listDiff is what changed between a service's listing and a new list:
// the instances that came (new IDs or addresses), the addresses of those
// that went, and the instances that stayed with other Metadata.
type listDiff struct {
	came     []registry.Instance
	went     []string // addresses, once per instance
	retagged []registry.Instance
	sorted   bool // the new list is strictly sorted by ID
}

// diff compares the list of service with ins.
func (c *Client) diff(service string, ins []registry.Instance) listDiff {
	c.addrMu.Lock()
	l := c.addrs[service]
	c.addrMu.Unlock()
	sorted := registry.SortedByID(ins)
	if l == nil || !l.sorted || !sorted {
		d := listDiff{came: ins, sorted: sorted}
		if l != nil {
			for _, in := range l.ins {
				d.went = append(d.went, in.Addr)
			}
		}
		return d
	}
	// Side by side. The strings and maps of an instance that stayed are
	// those of the old list: == stops at their pointers.
	d := listDiff{sorted: true}
	old, i := l.ins, 0
	for j := range ins {
		in := &ins[j]
		for i < len(old) && old[i].ID < in.ID {
			d.went = append(d.went, old[i].Addr)
			i++
		}
		if i < len(old) && old[i].ID == in.ID {
			switch {
			case old[i].Addr != in.Addr:
				d.went = append(d.went, old[i].Addr)
				d.came = append(d.came, *in)
			case !registry.SameInstance(old[i], *in):
				d.retagged = append(d.retagged, *in)
			}
			i++
			continue
		}
		d.came = append(d.came, *in)
	}
	for ; i < len(old); i++ {
		d.went = append(d.went, old[i].Addr)
	}
	return d
}

// apply records that service lists ins now, d being what changed. It
// forgets the connections and breakers of addresses no service lists any
// more. Otherwise instances that come and go at new addresses
// (containers) would leave one of each behind for the life of the client.
func (c *Client) apply(service string, ins []registry.Instance, d listDiff) {
	c.addrMu.Lock()
	defer c.addrMu.Unlock()
	if c.addrs == nil {
		c.addrs = make(map[string]*listing)
	}
	l := c.addrs[service]
	if l == nil {
		l = &listing{addrs: make(map[string]int)}
		c.addrs[service] = l
	}
	l.ins, l.sorted = ins, d.sorted
	for _, in := range d.came {
		l.addrs[in.Addr]++
	}
	for _, addr := range d.went {
		if l.addrs[addr]--; l.addrs[addr] > 0 {
			continue
		}
		delete(l.addrs, addr)
		if !c.stillListed(addr) {
			delete(c.tlsNames, addr)
			c.pool.Forget(addr)
			c.breakers.drop(addr)
		}
	}
}

// lists reports whether service lists addr now.
func (c *Client) lists(service, addr string) bool {
	c.addrMu.Lock()
	defer c.addrMu.Unlock()
	l := c.addrs[service]
	return l != nil && l.addrs[addr] > 0
}

// noteTLSNames records the MetadataTLSServerName values of ins. apply
// forgets them with their addresses.
func (c *Client) noteTLSNames(ins []registry.Instance) {
	c.addrMu.Lock()
	defer c.addrMu.Unlock()
	for _, in := range ins {
		if name := in.Metadata[MetadataTLSServerName]; name != "" {
			if c.tlsNames == nil {
				c.tlsNames = make(map[string]string)
			}
			c.tlsNames[in.Addr] = name
		}
	}
}

// serverName returns the transport's ServerName hook: the user's, then
// the MetadataTLSServerName of the instances at the address.
func (c *Client) serverName(user func(addr string) string) func(addr string) string {
	return func(addr string) string {
		if user != nil {
			if name := user(addr); name != "" {
				return name
			}
		}
		c.addrMu.Lock()
		defer c.addrMu.Unlock()
		return c.tlsNames[addr]
	}
}

// stillListed reports whether any service lists addr; addrMu held.
func (c *Client) stillListed(addr string) bool {
	for _, l := range c.addrs {
		if l.addrs[addr] > 0 {
			return true
		}
	}
	return false
}

// available reports whether an instance of st may take an attempt: it did
// not announce shutdown, its breaker is not open or st is panicking, and
// its dial backoff is not running while another instance could take it.
func (c *Client) available(st *serviceState, in *registry.Instance) bool {
	if !c.ready(st, in.Addr) {
		return false
	}
	// An address in backoff refuses the attempt at once. Picked while
	// another instance can take the call, it costs a retry from the
	// budget; under load the budget runs out and calls fail (p2c may
	// even prefer it, failing fast). Picked when it is all there is, it
	// says why the call fails.
	return !c.pool.BackingOff(in.Addr) || c.allBackingOff(st)
}

// ready reports whether addr, an instance of st, may take an attempt,
// dial backoff aside.
func (c *Client) ready(st *serviceState, addr string) bool {
	return !c.pool.ReadOnly(addr) && (!c.breakers.open(addr) || c.panicking(st))
}

// allBackingOff reports whether every instance of st that is ready is in
// dial backoff. It runs only for an instance in backoff.
func (c *Client) allBackingOff(st *serviceState) bool {
	p := st.ins.Load()
	if p == nil {
		return true
	}
	for i := range *p {
		a := (*p)[i].Addr
		if c.ready(st, a) && !c.pool.BackingOff(a) {
			return false
		}
	}
	return true
}

// panicking reports whether so many instances of st have tripped breakers
// that balancing ignores them (BreakerConfig.PanicThreshold). Instances
// shutting down count neither way.
func (c *Client) panicking(st *serviceState) bool {
	th := c.breakers.cfg.PanicThreshold
	if th < 0 || st == nil {
		return false
	}
	// The verdict is recomputed only after a breaker or the list changed.
	// A change of read-only marks alone may leave it stale until then.
	gen := c.breakers.gen.Load()
	if v := st.panic.Load(); v>>1 == gen {
		return v&1 == 1
	}
	var ins []registry.Instance
	if p := st.ins.Load(); p != nil {
		ins = *p
	}
	n, ejected := 0, 0
	for i := range ins {
		a := ins[i].Addr
		if c.pool.ReadOnly(a) {
			continue
		}
		n++
		if c.breakers.tripped(a) {
			ejected++
		}
	}
	panicking := ejected > 0 && float64(ejected) >= th*float64(n)
	v := gen << 1
	if panicking {
		v |= 1
	}
	st.panic.Store(v)
	return panicking
}

// newKey returns a fresh idempotency key: this client's random prefix and
// a counter.
func (c *Client) newKey() string {
	var b [40]byte
	n := copy(b[:], c.keyPrefix)
	return string(strconv.AppendUint(b[:n], c.keySeq.Add(1), 36))
}
