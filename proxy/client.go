package proxy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/codec"
	_ "github.com/dabbrpc/dabb/codec/proto" // the default codec
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
	// ErrNotSent: the request provably never left this process (no
	// instance, no connection, budget spent before sending): whatever the
	// method, it is safe to try again.
	ErrNotSent = transport.ErrNotSent
)

// Option configures a Client.
type Option func(*options)

type options struct {
	codec      string
	timeout    time.Duration
	methods    map[methodKey]time.Duration
	middleware []Middleware
	transport  transport.Config
	cache      registry.CacheConfig
	logger     *slog.Logger
}

type methodKey struct{ service, method string }

// WithCodec chooses the serialization by name (default "proto"); its
// package must be imported so it is registered.
func WithCodec(name string) Option { return func(o *options) { o.codec = name } }

// WithTimeout sets the timeout of calls whose method sets none (default 1 s).
func WithTimeout(d time.Duration) Option { return func(o *options) { o.timeout = d } }

// WithMethodTimeout overrides one method's timeout, whatever its interface
// directive says.
func WithMethodTimeout(service, method string, d time.Duration) Option {
	return func(o *options) {
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
	opts    options
	codec   codec.Codec
	codecEr error
	pool    *transport.Pool
	cache   *registry.Cache
	invoke  Invoker
	next    atomic.Uint64 // round-robin cursor
	calls   sync.Pool     // *Call
	reqs    sync.Pool     // *outgoing
	closed  atomic.Bool
}

// NewClient returns a client that finds instances through r. It does no
// I/O: connections and registry watches start with the first call. Close
// the client when done; r stays the caller's to close.
func NewClient(r registry.Registry, opts ...Option) *Client {
	c := &Client{}
	c.opts.codec = "proto"
	c.opts.timeout = DefaultTimeout
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
	c.pool = transport.NewPool(c.opts.transport)
	c.cache = registry.NewCache(r, c.opts.cache)
	c.calls.New = func() any { return new(Call) }
	c.reqs.New = func() any { return new(outgoing) }
	c.invoke = Chain(c.opts.middleware...)(c.failover(c.balance(c.send)))
	return c
}

// Close closes the client's connections and watches. Calls in flight fail.
func (c *Client) Close() error {
	if c.closed.Swap(true) {
		return nil
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
	*call = Call{Service: service, Method: method, Req: req, Resp: resp, Timeout: c.opts.timeout, codec: c.codec}
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
	call.Deadline = time.Now().Add(call.Timeout)
	if dl, ok := ctx.Deadline(); ok && dl.Before(call.Deadline) {
		call.Deadline = dl
	}
	var err error
	switch {
	case c.closed.Load():
		err = &protocol.Error{Status: protocol.StatusClientError, Msg: "client closed", Err: transport.ErrNotSent}
	case c.codecEr != nil:
		err = &protocol.Error{Status: protocol.StatusClientError, Msg: "codec " + c.opts.codec, Err: c.codecEr}
	default:
		err = c.invoke(ctx, call)
	}
	*call = Call{}
	c.calls.Put(call)
	return err
}

// Instances returns the instances of service the client currently knows,
// loading them on first use.
func (c *Client) Instances(ctx context.Context, service string) ([]registry.Instance, error) {
	return c.cache.Instances(ctx, service)
}

// maxAttempts bounds the attempts of one call.
const maxAttempts = 3

// failover tries another instance when an attempt provably was not acted
// on: the request never left this process (no connection, the instance is
// shutting down) or the server rejected it without running it (status
// 100, which a server also sends while it drains). Whatever the method,
// that is safe. Every attempt draws on the call's one budget.
func (c *Client) failover(next Invoker) Invoker {
	return func(ctx context.Context, call *Call) error {
		var err error
		for range maxAttempts {
			err = next(ctx, call)
			if err == nil || !notActed(err) || ctx.Err() != nil || time.Until(call.Deadline) < time.Millisecond {
				return err
			}
		}
		return err
	}
}

// notActed reports whether err proves the server did not act on the call.
func notActed(err error) bool {
	var pe *protocol.Error
	if !errors.As(err, &pe) {
		return false
	}
	switch {
	case pe.Remote:
		return pe.Status == protocol.StatusServerThreadpoolExhausted
	case pe.Status == protocol.StatusChannelInactive:
		return errors.Is(err, transport.ErrNotSent)
	}
	return false
}

// balance is the resolve-and-pick stage: it reads the service's instances
// from the cache (memory only after the first call) and chooses one for
// the attempt, skipping instances that announced they are shutting down.
func (c *Client) balance(next Invoker) Invoker {
	return func(ctx context.Context, call *Call) error {
		ins, err := c.cache.Instances(ctx, call.Service)
		if err != nil {
			return &protocol.Error{Status: protocol.StatusChannelInactive,
				Msg: "resolve " + call.Service, Err: fmt.Errorf("%w: %w", transport.ErrNotSent, err)}
		}
		n := len(ins)
		start := int(c.next.Add(1) % uint64(max(n, 1)))
		for i := range n {
			in := &ins[(start+i)%n]
			if !c.pool.ReadOnly(in.Addr) {
				call.Addr = in.Addr
				return next(ctx, call)
			}
		}
		msg := "no instance of " + call.Service
		if n > 0 {
			msg = "every instance of " + call.Service + " is shutting down"
		}
		return &protocol.Error{Status: protocol.StatusChannelInactive, Msg: msg, Err: transport.ErrNotSent}
	}
}

// outgoing holds a pooled request message and its payload buffer.
type outgoing struct {
	msg     protocol.Message
	payload []byte
}

// send is the last stage: it encodes the request, sends it to call.Addr
// with what remains of the budget, and decodes the reply.
func (c *Client) send(ctx context.Context, call *Call) error {
	budget := time.Until(call.Deadline)
	if budget < time.Millisecond {
		return &protocol.Error{Status: protocol.StatusClientTimeout,
			Msg: "budget spent before sending " + call.Service + "." + call.Method, Err: transport.ErrNotSent}
	}
	out := c.reqs.Get().(*outgoing)
	defer c.reqs.Put(out)
	payload, err := call.codec.Marshal(out.payload[:0], call.Req)
	if err != nil {
		return &protocol.Error{Status: protocol.StatusClientError,
			Msg: "encode " + call.Service + "." + call.Method + " request", Err: fmt.Errorf("%w: %w", transport.ErrNotSent, err)}
	}
	out.payload = payload
	m := &out.msg
	*m = protocol.Message{
		Service:     call.Service,
		Method:      call.Method,
		Timeout:     budget,
		Attachments: call.Attachments,
		Payload:     payload,
	}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, call.codec.ID()), 0, 0)
	resp, err := c.pool.RoundTrip(ctx, call.Addr, m)
	*m = protocol.Message{}
	if err != nil {
		return err
	}
	err = call.codec.Unmarshal(resp.Payload, call.Resp)
	c.pool.Release(resp)
	if err != nil {
		return &protocol.Error{Status: protocol.StatusBadResponse,
			Msg: "decode " + call.Service + "." + call.Method + " reply", Err: err}
	}
	return nil
}
