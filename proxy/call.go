// Call, the middleware chain, and the options of one call.

package proxy

import (
	"context"
	"time"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/protocol"
)

// Caller is what generated client stubs hold: one method that makes a call.
// *Client implements it; so can a test double.
type Caller interface {
	Invoke(ctx context.Context, service, method string, req, resp any, opts ...CallOption) error
}

// Call is one call on its way through the client's middlewares. It is valid
// only until Invoke returns; a middleware must not keep it.
//
// A middleware may change what the balancing stage reads after it:
// Deadline, Attachments, HashKey, FailFast, Hedge, Idempotent and
// OnAttempt. Changing
// Timeout has no effect by then: Deadline was computed from it before the
// first middleware ran. A middleware's own error, returned without calling
// next, reaches the caller as the cause of a local 90 (31 for a deadline).
// errors.Is still finds it.
type Call struct {
	// Service and Method name the remote method.
	Service, Method string
	// Req is the request message; Resp the message to decode the reply
	// into. Req is nil for an InvokeJSON of a JSON-codec method: its
	// request travels as the caller's JSON, already encoded.
	Req, Resp any
	// Idempotent says the method is safe to run more than once.
	Idempotent bool
	// Timeout is the call's timeout after every override. Set Deadline,
	// not Timeout, to change the budget.
	Timeout time.Duration
	// Deadline is when the call's whole budget runs out: the earlier of
	// the context's deadline and the start plus Timeout. Every attempt
	// sends what remains of it.
	Deadline time.Time
	// Attachments travel with every attempt (trace ids, auth, a key set
	// with IdempotencyKey). Middlewares may add to it; nil when empty.
	// The key the client makes for a call that has none travels beside
	// them and is not in this map.
	Attachments map[string]string
	// HashKey routes the call with the consistent hash balancer: calls
	// with equal keys go to the same instance.
	HashKey string
	// FailFast forbids retries: the first failure is returned.
	FailFast bool
	// Hedge, for an idempotent call, sends a second attempt to another
	// instance when the first has not answered after this delay. The
	// first answer wins; the other attempt is cancelled. Default 0: off.
	Hedge time.Duration
	// Addr and Attempt are the instance and the number (from 1) of an
	// attempt, set after the middlewares ran. Once next returns they name
	// the attempt whose outcome the call returns. That is the one that
	// succeeded, or the one whose error is returned. It is not always the
	// last: an attempt that may have reached a server outranks a later one
	// that failed unsent. Empty and 0 when no attempt was made.
	Addr    string
	Attempt int
	// OnAttempt, when set, is told of each attempt as it goes out, after
	// its instance is picked and before it is sent. It is called on the
	// call's goroutine, once per attempt, in order, before next returns.
	// A middleware sets it to record retries and hedges (tracing does).
	// Default nil: nothing is called.
	OnAttempt func(AttemptInfo)

	codec codec.Codec
	// payload, when set, is the request already marshaled, and Req is not
	// read. A hedged call's attempts share it; it is not modified.
	payload []byte
	// route, when set, is the service whose instances the call balances
	// over (Via); the wire names Service.
	route string
	// key is the idempotency key the client made for this call; empty
	// when the call has one in Attachments or needs none.
	key   string
	start time.Time        // when Invoke began
	tried [maxTried]string // instances this call attempted, for retries
	st    *serviceState    // the balanced service's, once resolved
}

// balanced is the service whose instances take the call's attempts: the
// one Via named, else Service. Its balancer, breakers' panic verdict and
// registry lookup are the call's.
func (c *Call) balanced() string {
	if c.route != "" {
		return c.route
	}
	return c.Service
}

// AttemptInfo describes an attempt of a call as it goes out
// (Call.OnAttempt).
type AttemptInfo struct {
	// Attempt is the attempt's number, from 1.
	Attempt int
	// Addr is the instance it goes to.
	Addr string
	// Hedge marks the backup attempt of a hedged call (proxy.Hedge).
	Hedge bool
	// After is the failure of the attempt this one follows. It is nil for
	// the first attempt, and for a backup sent because the first had not
	// answered in time.
	After error
}

// SetAttachment adds a key/value pair to the call's attachments.
func (c *Call) SetAttachment(key, value string) {
	if c.Attachments == nil {
		c.Attachments = make(map[string]string, 2)
	}
	c.Attachments[key] = value
}

// Invoker makes a call; the last one in a chain sends it.
type Invoker func(ctx context.Context, call *Call) error

// Middleware wraps an Invoker: logging, auth, metrics, retries and the
// like. It calls next to continue the call.
type Middleware func(next Invoker) Invoker

// Chain composes middlewares so that the first one given is the outermost:
// Chain(a, b)(inv) runs a, then b, then inv. Nil entries are skipped.
func Chain(mws ...Middleware) Middleware {
	return func(next Invoker) Invoker {
		for i := len(mws) - 1; i >= 0; i-- {
			if mws[i] != nil {
				next = mws[i](next)
			}
		}
		return next
	}
}

// CallOption changes one call. Generated stubs pass the options their
// interface's directives ask for; users pass more through WithCallOptions.
type CallOption interface{ apply(*Call) }

type idempotentOption struct{}

func (idempotentOption) apply(c *Call) { c.Idempotent = true }

// Idempotent marks the call as safe to run more than once, so it may be
// retried after a failure that leaves its outcome unknown.
func Idempotent() CallOption { return idempotentOption{} }

type timeoutOption time.Duration

func (t timeoutOption) apply(c *Call) {
	if t > 0 {
		c.Timeout = time.Duration(t)
	}
}

// Timeout sets the call's timeout. The context's deadline still wins when
// it is earlier. A d of zero or less is ignored (it does not mean "no
// timeout": every call has one).
func Timeout(d time.Duration) CallOption { return timeoutOption(d) }

type attachmentOption struct{ key, value string }

func (a attachmentOption) apply(c *Call) { c.SetAttachment(a.key, a.value) }

// Attachment adds a key/value attachment to the call.
func Attachment(key, value string) CallOption { return attachmentOption{key, value} }

// IdempotencyKey sets the idempotency key that every attempt of the call
// carries; the server reads it with dabb.IdempotencyKey.
func IdempotencyKey(key string) CallOption {
	return attachmentOption{protocol.AttachIdempotencyKey, key}
}

type hashKeyOption string

func (k hashKeyOption) apply(c *Call) { c.HashKey = string(k) }

// HashKey sets the key the consistent hash balancer routes the call by.
func HashKey(key string) CallOption { return hashKeyOption(key) }

type failFastOption struct{}

func (failFastOption) apply(c *Call) { c.FailFast = true }

// FailFast makes the call fail on its first error, without retries.
func FailFast() CallOption { return failFastOption{} }

type hedgeOption time.Duration

func (h hedgeOption) apply(c *Call) { c.Hedge = time.Duration(h) }

// Hedge sends a backup attempt to another instance when the first has not
// answered after delay. Whichever answers first wins; the other is
// cancelled. It applies to idempotent methods only, since both attempts
// may run; others ignore it.
//
// The backup is a retry as far as the RetryPolicy goes. MaxAttempts 1
// turns it off. It draws on the retry budget, so during an outage hedging
// stops doubling the load. When the first attempt fails before the delay,
// the backup goes at once only if that failure may be retried (never with
// FailFast).
func Hedge(delay time.Duration) CallOption { return hedgeOption(delay) }

// UseCodec makes the call in c, whatever the client's codec
// (WithCodec). The codec's id is the request's serialization id, so a
// codec whose id has a body format of its own (hessian2, id 2, from the
// dubbo module) makes the request in that format. A nil c is ignored.
func UseCodec(c codec.Codec) CallOption { return codecOption{c} }

type callOptionsKey struct{}

// WithCallOptions returns a context that applies opts to every call made
// with it. They apply after the stub's options and the client's
// configuration: this is how to override a method's timeout for one call.
func WithCallOptions(ctx context.Context, opts ...CallOption) context.Context {
	if prev, ok := ctx.Value(callOptionsKey{}).([]CallOption); ok {
		opts = append(append([]CallOption(nil), prev...), opts...)
	}
	return context.WithValue(ctx, callOptionsKey{}, opts)
}
