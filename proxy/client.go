package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/codec"
	_ "github.com/dabbrpc/dabb/codec/proto" // the default codec
	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// DefaultTimeout is a call's timeout when nothing sets one: one second, as
// in Dubbo.
const DefaultTimeout = time.Second

// Errors a call can return, matched with errors.Is. Every error from Invoke
// is a *protocol.Error (errors.As) with the status and whether the peer sent
// it (Remote).
var (
	// ErrTimeout: the call's budget ran out.
	ErrTimeout = protocol.ErrTimeout
	// ErrUnavailable: no instance could take the call, or the connection
	// was lost.
	ErrUnavailable = protocol.ErrUnavailable
	// ErrNotFound: the server has no such service or method.
	ErrNotFound = protocol.ErrNotFound
	// ErrOverloaded: the server rejected the call without running it.
	ErrOverloaded = protocol.ErrOverloaded
	// ErrBadRequest: the request or reply could not be encoded or
	// understood.
	ErrBadRequest = protocol.ErrBadRequest
	// ErrServiceError: the method ran and returned an error.
	ErrServiceError = protocol.ErrServiceError
	// ErrCanceled: the caller gave up: its context was cancelled, or it
	// called after Close. (A call in flight when Close runs fails with
	// its connection, 35: the server may have acted.)
	ErrCanceled = protocol.ErrCanceled
	// ErrNotSent: the request provably never left this process (no
	// instance, no connection, budget spent before sending): whatever the
	// method, it is safe to try again.
	ErrNotSent = protocol.ErrNotSent
)

// Option configures a Client.
type Option func(*options)

type options struct {
	codec           string
	timeout         time.Duration
	methods         map[methodKey]time.Duration
	middleware      []Middleware
	transport       transport.Config
	cache           registry.CacheConfig
	logger          *slog.Logger
	balancer        string
	balancers       map[string]string
	retry           RetryPolicy
	breaker         BreakerConfig
	observer        Observer
	idempotencyKeys bool
}

type methodKey struct{ service, method string }

// WithCodec chooses the serialization by name (default "proto"); its
// package must be imported so it is registered.
func WithCodec(name string) Option { return func(o *options) { o.codec = name } }

// WithTimeout sets the timeout of calls whose method sets none (default 1 s).
// A d of zero or less is ignored: every call has a timeout.
func WithTimeout(d time.Duration) Option {
	return func(o *options) {
		if d > 0 {
			o.timeout = d
		}
	}
}

// WithMethodTimeout overrides one method's timeout, whatever its interface
// directive says. A d of zero or less is ignored.
func WithMethodTimeout(service, method string, d time.Duration) Option {
	return func(o *options) {
		if d <= 0 {
			return
		}
		if o.methods == nil {
			o.methods = map[methodKey]time.Duration{}
		}
		o.methods[methodKey{service, method}] = d
	}
}

// WithMiddleware adds interceptors around every call, the first outermost.
func WithMiddleware(mws ...Middleware) Option {
	return func(o *options) { o.middleware = append(o.middleware, mws...) }
}

// WithTransport configures the connection pool (connections per address,
// dial timeout, heartbeats, body limit).
func WithTransport(cfg transport.Config) Option { return func(o *options) { o.transport = cfg } }

// WithCache configures the instance cache (snapshot file, empty-push
// protection).
func WithCache(cfg registry.CacheConfig) Option { return func(o *options) { o.cache = cfg } }

// WithBalancer chooses the load balancer (balancer.P2C by default) for every
// service, or, with services named, for those only.
func WithBalancer(name string, services ...string) Option {
	return func(o *options) {
		if len(services) == 0 {
			o.balancer = name
			return
		}
		if o.balancers == nil {
			o.balancers = map[string]string{}
		}
		for _, s := range services {
			o.balancers[s] = name
		}
	}
}

// WithRetry sets the retry policy (see RetryPolicy for the defaults).
func WithRetry(p RetryPolicy) Option { return func(o *options) { o.retry = p } }

// WithBreaker configures the per-instance circuit breakers.
func WithBreaker(cfg BreakerConfig) Option { return func(o *options) { o.breaker = cfg } }

// WithObserver reports every attempt, retry and breaker change to obs (see
// proxy/prometheus for one that exports Prometheus metrics).
func WithObserver(obs Observer) Option { return func(o *options) { o.observer = obs } }

// WithoutIdempotencyKeys stops the client from giving each call of a
// method that is not idempotent a key (the protocol.AttachIdempotencyKey
// attachment) that every attempt repeats.
func WithoutIdempotencyKeys() Option { return func(o *options) { o.idempotencyKeys = false } }

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// Client calls services found through a registry. It is safe for concurrent
// use; make one per process and share it.
//
//	c := proxy.NewClient(reg)
//	defer c.Close()
//	inv := inventory.NewInventoryClient(c)
//	reply, err := inv.Deduct(ctx, &pb.DeductRequest{Sku: "sku-42", Count: 1})
type Client struct {
	opts     options
	codec    codec.Codec
	codecEr  error
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

	addrMu sync.Mutex                     // guards addrs
	addrs  map[string]map[string]struct{} // service: the addresses it lists now

	keyPrefix string        // random, per client: idempotency keys
	keySeq    atomic.Uint64 // idempotency key counter
}

// NewClient returns a client that finds instances through r. It does no
// I/O: connections and registry watches start with the first call. Close
// the client when done; r stays the caller's to close.
func NewClient(r registry.Registry, opts ...Option) *Client {
	c := &Client{}
	c.opts.codec = "proto"
	c.opts.timeout = DefaultTimeout
	c.opts.idempotencyKeys = true
	for _, o := range opts {
		o(&c.opts)
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
	c.codec, c.codecEr = codec.ByName(c.opts.codec)
	if c.codecEr != nil {
		c.opts.logger.Error("dabb: every call of this client will fail", "err", c.codecEr)
	}
	// A bad balancer name fails the calls of its services (90, not
	// sent); NewClient has no error to return, so it says so at once.
	for _, name := range c.balancerNames() {
		if _, err := balancer.New(name, balancer.Config{}); err != nil {
			c.opts.logger.Error("dabb: calls to the services using this balancer will fail", "err", err)
		}
	}
	// A server restarted at an address that shut down is a new process:
	// the old one's breaker history is not its own.
	onBack := c.opts.transport.OnBack
	c.opts.transport.OnBack = func(addr string) {
		c.breakers.forget(addr)
		if onBack != nil {
			onBack(addr)
		}
	}
	c.pool = transport.NewPool(c.opts.transport)
	c.cache = registry.NewCache(r, c.opts.cache)
	c.opts.retry = c.opts.retry.withDefaults()
	c.budget = newRetryBudget(c.opts.retry.BudgetRatio, c.opts.retry.BudgetFloor)
	c.breakers = newBreakers(c.opts.breaker, c.opts.logger, c.opts.observer)
	empty := map[string]*serviceState{}
	c.services.Store(&empty)
	c.keyPrefix = strconv.FormatUint(rand.Uint64(), 36) + "-"
	c.calls.New = func() any { return new(Call) }
	c.reqs.New = func() any { return new(outgoing) }
	c.invoke = Chain(c.opts.middleware...)(c.run)
	return c
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
	return c.pool.Close()
}

// Invoke calls service.method with req and decodes the reply into resp.
// Options apply in this order, later ones winning: opts (the stub's, from
// the interface's directives), the client's WithMethodTimeout, then those
// on ctx from WithCallOptions. ctx's deadline wins over any timeout that is
// later.
func (c *Client) Invoke(ctx context.Context, service, method string, req, resp any, opts ...CallOption) error {
	call := c.calls.Get().(*Call)
	att := call.Attachments // kept across calls, so attachments cost no map
	clear(att)
	*call = Call{Service: service, Method: method, Req: req, Resp: resp, Timeout: c.opts.timeout, Attachments: att, codec: c.codec}
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
	case c.codecEr != nil:
		err = protocol.NotSent(protocol.StatusClientError, "codec "+c.opts.codec, c.codecEr)
	default:
		if err = c.invoke(ctx, call); err != nil {
			err = asCallError(err)
		}
	}
	*call = Call{Attachments: call.Attachments}
	c.calls.Put(call)
	return err
}

// asCallError makes every error a call returns a *protocol.Error, as the
// package promises: one a middleware made of its own becomes the cause of
// a local 90 (or 31, at a deadline; the call may have been sent before
// the middleware failed it), so errors.As finds a status and errors.Is
// still finds the middleware's own error.
func asCallError(err error) error {
	if _, ok := err.(*protocol.Error); ok {
		return err
	}
	var pe *protocol.Error
	if errors.As(err, &pe) {
		return err
	}
	status := protocol.StatusClientError
	if errors.Is(err, context.DeadlineExceeded) {
		status = protocol.StatusServerTimeout
	}
	return &protocol.Error{Status: status, Err: err}
}

// Instances returns the instances of service the client currently knows,
// loading them on first use.
func (c *Client) Instances(ctx context.Context, service string) ([]registry.Instance, error) {
	return c.cache.Instances(ctx, service)
}

// Stale reports whether the client calls service on instances the
// registry has not confirmed lately (it is unreachable, or they came from
// the snapshot file): calls go on, and a health check may say so. See
// registry.Cache.Stale.
func (c *Client) Stale(service string) bool { return c.cache.Stale(service) }

// Suspect reports whether the instances of service were kept despite a
// registry answer that would have emptied them (registry.CacheConfig's
// ProtectEmpty). See registry.Cache.Suspect.
func (c *Client) Suspect(service string) bool { return c.cache.Suspect(service) }

// serviceState is what the client keeps per service it calls: the
// balancer, fed by the registry cache.
type serviceState struct {
	bal   balancer.Balancer
	unsub func()
}

// service returns the state of a service, creating it on the first call
// (bounded by the call's deadline):
// it loads the instances (the cache's first lookup), builds the balancer
// and subscribes it to changes.
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
	bal, err := balancer.New(kind, balancer.Config{Available: c.available})
	if err != nil {
		return nil, err
	}
	unsub, err := c.cache.Subscribe(name, func(ins []registry.Instance) {
		bal.Update(ins)
		c.listed(name, ins)
	})
	if err != nil {
		return nil, err
	}
	st := &serviceState{bal: bal, unsub: unsub}
	next := make(map[string]*serviceState, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[name] = st
	c.services.Store(&next)
	return st, nil
}

// listed records the addresses service lists now, and forgets the
// connections and breakers of addresses that no service lists any more:
// instances that come and go at new addresses (containers) would
// otherwise leave one of each behind for the life of the client.
func (c *Client) listed(service string, ins []registry.Instance) {
	now := make(map[string]struct{}, len(ins))
	for _, in := range ins {
		now[in.Addr] = struct{}{}
	}
	c.addrMu.Lock()
	defer c.addrMu.Unlock()
	if c.addrs == nil {
		c.addrs = make(map[string]map[string]struct{})
	}
	before := c.addrs[service]
	c.addrs[service] = now
	for addr := range before {
		if _, ok := now[addr]; ok {
			continue
		}
		if !c.stillListed(addr) {
			c.pool.Forget(addr)
			c.breakers.drop(addr)
		}
	}
}

// stillListed reports whether any service lists addr; addrMu held.
func (c *Client) stillListed(addr string) bool {
	for _, set := range c.addrs {
		if _, ok := set[addr]; ok {
			return true
		}
	}
	return false
}

// noInstance is the error of a call that found no instance to take its
// first attempt (perr is the balancer's): one sentence that names the
// service, how many instances are known and why none could take it. It
// matches ErrUnavailable, ErrNotSent and balancer.ErrNoInstance.
func (c *Client) noInstance(ctx context.Context, service string, perr error) error {
	msg := "no instance of " + service + " can take the call: " + c.whyNone(ctx, service, nil)
	return protocol.NotSent(protocol.StatusChannelInactive, msg, &quietError{msg, []error{perr}})
}

// noneLeft is the error of a call that found no instance to take attempt
// next after earlier ones failed with err (the error the call returns, of
// the attempt call.Addr and call.Attempt name): err itself, status, cause
// and all, with a message that says why the call went no further first.
// An err that is not a *protocol.Error is returned as it is.
func (c *Client) noneLeft(ctx context.Context, call *Call, err error, next int, tried []string) error {
	pe, ok := err.(*protocol.Error)
	if !ok {
		return err
	}
	msg := "no instance of " + call.Service + " can take attempt " + strconv.Itoa(next) + ": " +
		c.whyNone(ctx, call.Service, tried) + "; attempt " + strconv.Itoa(call.Attempt)
	if !strings.Contains(pe.Error(), call.Addr) { // a dial error names it already
		msg += ", on " + call.Addr + ","
	}
	msg += " failed"
	// The attempt's own message, unless it is its cause's text, which
	// Error prints after the message.
	if pe.Msg != "" && (pe.Err == nil || pe.Err.Error() != pe.Msg) {
		msg += ": " + pe.Msg
	}
	out := *pe
	out.Msg = msg
	return &out
}

// quietError carries the causes of an error whose message already says
// all they would: protocol.Error prints a cause whose text equals its
// message once.
type quietError struct {
	msg  string
	errs []error
}

func (e *quietError) Error() string   { return e.msg }
func (e *quietError) Unwrap() []error { return e.errs }

// whyNone says why no known instance of service could take an attempt:
// "none is known", "both known instances have an open circuit breaker",
// "of its 3 known instances, 2 are shutting down and 1 was already tried".
// An instance counts once, for the first of: shutting down, breaker open,
// in tried; one for none of them (its state changed since the pick) is
// "unavailable".
func (c *Client) whyNone(ctx context.Context, service string, tried []string) string {
	ins, err := c.cache.Instances(ctx, service)
	if err != nil || len(ins) == 0 {
		return "none is known"
	}
	var n [4]int // shutting down, breaker open, tried, other
	for i := range ins {
		switch addr := ins[i].Addr; {
		case c.pool.ReadOnly(addr):
			n[0]++
		case c.breakers.open(addr):
			n[1]++
		case slices.Contains(tried, addr):
			n[2]++
		default:
			n[3]++
		}
	}
	verbs := [4][2]string{
		{"is shutting down", "are shutting down"},
		{"has an open circuit breaker", "have an open circuit breaker"},
		{"was already tried", "were already tried"},
		{"is unavailable", "are unavailable"},
	}
	verb := func(k, count int) string {
		if count == 1 {
			return verbs[k][0]
		}
		return verbs[k][1]
	}
	var parts []string
	for k, count := range n {
		if count == len(ins) { // one reason for all
			switch count {
			case 1:
				return "its only known instance " + verb(k, 1)
			case 2:
				return "both known instances " + verb(k, 2)
			}
			return "all " + strconv.Itoa(count) + " known instances " + verb(k, count)
		}
		if count > 0 {
			parts = append(parts, strconv.Itoa(count)+" "+verb(k, count))
		}
	}
	last := len(parts) - 1
	list := strings.Join(parts[:last], ", ") + " and " + parts[last]
	return "of its " + strconv.Itoa(len(ins)) + " known instances, " + list
}

// available reports whether an instance may take an attempt: it did not
// announce shutdown and its breaker is not open.
func (c *Client) available(in *registry.Instance) bool {
	return !c.pool.ReadOnly(in.Addr) && !c.breakers.open(in.Addr)
}

// run is the last stage of the middleware chain: it makes the call's
// attempts, each on an instance the balancer picks, retrying as the
// RetryPolicy allows within the call's one budget.
func (c *Client) run(ctx context.Context, call *Call) error {
	st, err := c.service(ctx, call.Service, call.Deadline)
	if err != nil {
		status := protocol.StatusChannelInactive
		switch {
		case errors.Is(err, context.DeadlineExceeded):
			status = protocol.StatusClientTimeout // the budget ran out waiting for the registry
		case errors.Is(err, context.Canceled):
			status = protocol.StatusClientError // the caller gave up: ErrCanceled
		case errors.Is(err, registry.ErrInvalid):
			// A bad service name, an unknown balancer, a service the
			// registry refuses: a bad request, not an outage.
			status = protocol.StatusClientError
		}
		return protocol.NotSent(status, "resolve "+call.Service, err)
	}
	c.budget.call(call.start.Unix())
	if !call.Idempotent && c.opts.idempotencyKeys {
		if _, ok := call.Attachments[protocol.AttachIdempotencyKey]; !ok {
			call.SetAttachment(protocol.AttachIdempotencyKey, c.newKey())
		}
	}
	if err := ctx.Err(); err != nil {
		// Before any pick: a call nobody waits for takes no probe of a
		// half-open breaker and no place in the balancer's figures.
		return protocol.ContextError(err, false)
	}
	if call.Hedge > 0 && call.Idempotent {
		return c.hedged(ctx, call, st)
	}
	policy := &c.opts.retry
	tried := &call.tried
	ntried := 0
	// sent is the error of the latest attempt that may have reached the
	// server: once there is one, the call's error must not say ErrNotSent
	// (a retry that failed unsent does not undo it).
	//
	// The Call names the attempt whose error is returned: final sets
	// Addr and Attempt back to sent's when it returns sent.
	var sent error
	var sentAddr string
	var sentAttempt int
	// withdrawn is the retry budget's withdrawal for the retry about to
	// be made (0: none): refunded when that retry never goes out.
	var withdrawn int64
	final := func(err error) error {
		if withdrawn != 0 {
			c.budget.refund(withdrawn)
			withdrawn = 0
		}
		if sent != nil && errors.Is(err, ErrNotSent) {
			call.Addr, call.Attempt = sentAddr, sentAttempt
			return sent
		}
		return err
	}
	for attempt := 1; ; attempt++ {
		var in registry.Instance
		var done balancer.Done
		var perr error
		if ntried == 0 {
			in, done, perr = st.bal.Pick(ctx, call.HashKey)
		} else {
			in, done, perr = st.bal.PickExcept(ctx, call.HashKey, tried[:ntried])
			if perr != nil && errors.Is(perr, balancer.ErrNoInstance) {
				in, done, perr = st.bal.Pick(ctx, call.HashKey) // all tried: any usable one again
			}
		}
		if perr != nil {
			if err != nil {
				// The error of an attempt says more than "no
				// instance": the call returns it, saying first why
				// it went no further.
				return c.noneLeft(ctx, call, final(err), attempt, nil)
			}
			return c.noInstance(ctx, call.Service, perr)
		}
		withdrawn = 0 // the retry goes out
		if ntried < maxTried {
			tried[ntried] = in.Addr
			ntried++
		}
		call.Addr = in.Addr
		call.Attempt = attempt
		err = c.attempt(ctx, call, done)
		if err == nil {
			return nil
		}
		if !errors.Is(err, ErrNotSent) {
			sent, sentAddr, sentAttempt = err, call.Addr, call.Attempt
		}
		ok, sec := c.retryable(ctx, call, err, attempt, policy)
		if !ok {
			return final(err)
		}
		withdrawn = sec
		if pause := policy.backoff(attempt); pause > 0 {
			if time.Until(call.Deadline) <= pause+time.Millisecond {
				return final(err)
			}
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return final(err)
			}
		}
		if c.opts.observer != nil {
			c.opts.observer.Retried(call.Service, call.Method, protocol.StatusOf(err))
		}
	}
}

// maxTried bounds the addresses a call remembers to avoid on retries.
const maxTried = 8

// retryable decides whether a failed attempt is tried again; when it is,
// sec is the retry budget's withdrawal, to be refunded if the retry never
// goes out.
func (c *Client) retryable(ctx context.Context, call *Call, err error, attempt int, p *RetryPolicy) (ok bool, sec int64) {
	if call.FailFast || attempt >= p.MaxAttempts || ctx.Err() != nil || time.Until(call.Deadline) < time.Millisecond {
		return false, 0
	}
	switch classify(err) {
	case notActed:
	case unknown:
		if !call.Idempotent {
			return false, 0
		}
	default:
		return false, 0
	}
	sec, ok = c.budget.withdraw()
	return ok, sec
}

// attempt sends one attempt to call.Addr through its breaker and reports
// the outcome to the balancer.
func (c *Client) attempt(ctx context.Context, call *Call, done balancer.Done) error {
	return c.guarded(call, call.Addr, done, func(start time.Time) error { return c.send(ctx, call, start) })
}

// guarded runs one attempt to addr under addr's circuit breaker, then
// reports its outcome to the balancer (done) and the observer. A breaker
// that refuses the attempt makes it fail as not sent.
func (c *Client) guarded(call *Call, addr string, done balancer.Done, run func(start time.Time) error) error {
	start := time.Now()
	var err error
	// A failure from an address that announced its shutdown says nothing
	// of the next process there (a restart on the same port): it counts
	// neither for its breaker nor for the balancer's figures.
	draining := false
	if c.breakers.cfg.Disabled {
		err = run(start)
		draining = err != nil && c.pool.ReadOnly(addr)
	} else {
		ran := false
		_, berr := c.breakers.get(addr).cb.Execute(func() (struct{}, error) {
			ran = true
			err = run(start)
			if draining = err != nil && c.pool.ReadOnly(addr); draining {
				return struct{}{}, errDraining
			}
			return struct{}{}, err
		})
		if !ran {
			err = protocol.NotSent(protocol.StatusChannelInactive, addr, fmt.Errorf("%w: %w", errBreakerOpen, berr))
		}
	}
	latency := time.Since(start)
	if instanceFailure(err) && !errors.Is(err, errBreakerOpen) && !draining {
		done(latency, err)
	} else {
		done(latency, nil)
	}
	if c.opts.observer != nil {
		c.opts.observer.Attempted(call.Service, call.Method, addr, protocol.StatusOf(err), latency)
	}
	return err
}

// newKey returns a fresh idempotency key: this client's random prefix and
// a counter.
func (c *Client) newKey() string {
	var b [40]byte
	n := copy(b[:], c.keyPrefix)
	return string(strconv.AppendUint(b[:n], c.keySeq.Add(1), 36))
}

// outgoing holds a pooled request message and its payload buffer.
type outgoing struct {
	msg     protocol.Message
	payload []byte
}

// send is the last stage: it encodes the request, sends it to call.Addr
// with what remains of the budget, and decodes the reply.
func (c *Client) send(ctx context.Context, call *Call, start time.Time) error {
	resp, err := c.exchange(ctx, call, call.Addr, start)
	if err != nil {
		return err
	}
	return c.decode(call, resp)
}

// exchange encodes the request, sends it to addr with what remains of the
// budget and returns the OK response, which the caller must decode (or
// release).
func (c *Client) exchange(ctx context.Context, call *Call, addr string, start time.Time) (*protocol.Message, error) {
	budget, err := c.attemptBudget(call, start, start)
	if err != nil {
		return nil, err
	}
	out := c.reqs.Get().(*outgoing)
	defer func() {
		if cap(out.payload) > bufpool.MaxKept {
			// Written by now (or never to be): hand a large buffer back
			// to the shared pool instead of pinning it to a pooled request.
			bufpool.Put(out.payload)
			out.payload = nil
		}
		c.reqs.Put(out)
	}()
	payload := call.payload
	if payload == nil {
		if payload, err = call.codec.Marshal(out.payload[:0], call.Req); err != nil {
			return nil, encodeError(call, err)
		}
		out.payload = payload
		if len(payload) >= slowMarshal {
			// Encoding this much takes a measurable part of the budget
			// (ms for MiB): what travels is what is left after it.
			if budget, err = c.attemptBudget(call, start, time.Now()); err != nil {
				return nil, err
			}
		}
	}
	m := &out.msg
	*m = protocol.Message{
		Service:     call.Service,
		Method:      call.Method,
		Timeout:     budget,
		Attachments: call.Attachments,
		Payload:     payload,
	}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, call.codec.ID()), 0, 0)
	resp, err := c.pool.RoundTrip(ctx, addr, m)
	*m = protocol.Message{}
	return resp, err
}

// slowMarshal is the encoded size from which exchange reads the clock again
// after marshaling, to send only what is left of the budget.
const slowMarshal = 64 << 10

// attemptBudget is what an attempt that began at start has left at now: the
// call's deadline, or the per-try timeout of an idempotent call if that
// ends first. Less than a millisecond is an error: not sent.
func (c *Client) attemptBudget(call *Call, start, now time.Time) (time.Duration, error) {
	budget := call.Deadline.Sub(now)
	if pt := c.opts.retry.PerTryTimeout; pt > 0 && call.Idempotent {
		budget = min(budget, pt-now.Sub(start))
	}
	if budget < time.Millisecond {
		return 0, protocol.NotSent(protocol.StatusClientTimeout, "budget spent before sending "+call.Service+"."+call.Method, nil)
	}
	return budget, nil
}

// encodeError is the error of a request the codec could not marshal.
func encodeError(call *Call, err error) error {
	return protocol.NotSent(protocol.StatusClientError, "encode "+call.Service+"."+call.Method+" request", err)
}

// decode decodes an OK response into call.Resp and releases it.
func (c *Client) decode(call *Call, resp *protocol.Message) error {
	err := call.codec.Unmarshal(resp.Payload, call.Resp)
	c.pool.Release(resp)
	if err != nil {
		return &protocol.Error{Status: protocol.StatusBadResponse,
			Msg: "decode " + call.Service + "." + call.Method + " reply", Err: err}
	}
	return nil
}
