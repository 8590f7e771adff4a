// Server interceptors: the chain around every call a Server serves.

package dabb

import (
	"context"
	"fmt"
	"math/rand/v2"
	"reflect"
	"runtime/debug"

	"github.com/dabbrpc/dabb/protocol"
)

// CallInfo describes the call an Interceptor wraps. The server reuses it
// for later calls: read it, do not modify it, and do not keep the pointer
// after the interceptor returns. Its fields may be kept.
type CallInfo struct {
	Service string // the service's name on the wire, e.g. "inventory.Inventory"
	Method  string // the method's name on the wire, e.g. "Deduct"
	// Idempotent records //dabb:idempotent for the method, as the server's
	// ServiceDesc says. It is not what the caller claimed.
	Idempotent bool
	// Attachments are the request's attachments; nil when it has none.
	// The map is the request's own: read it, do not modify it.
	Attachments map[string]string
	// IdempotencyKey is the request's key; empty when it has none.
	IdempotencyKey string

	// open is set for a call that skips the credential checks
	// (CredentialCheck): a call to the health service, by default.
	open bool
}

// CallHandler runs the rest of the chain and then the method: it decodes
// the request, calls the implementation and returns its reply. The
// method's context is the ctx given to it.
type CallHandler func(ctx context.Context) (reply any, err error)

// Interceptor wraps every call a Server serves. It may reject the call by
// returning an error without calling next; the handler then never runs.
// It may call next and observe the reply, the error and the time taken.
// StatusOf tells the status the server answers for an error.
//
// It runs before the request is decoded, so a rejected call costs no
// decoding. RemotePeer(ctx) tells who called. Call next before returning,
// never after: the request's bytes are reused then.
//
// A panic in next comes back as a *PanicError, already logged. A panic in
// the interceptor itself is recovered the same way, so the interceptors
// outside it see it as an error. A reply of nil (or a nil pointer) with a
// nil error becomes an error of status 70, from the handler or from any
// interceptor, unless the request is one-way (no reply goes back).
type Interceptor func(ctx context.Context, info *CallInfo, next CallHandler) (reply any, err error)

// CredentialCheck declares check a credential check and returns it
// ready for WithInterceptor. The server skips it for a call to the
// health service (dabb.Health) unless WithHealthCredentials(true) is
// given: the call goes on to the next interceptor, as if check had
// admitted it. For every other call check runs as given. RequireToken,
// TokenSet.Intercept and RequirePeerIdentity are credential checks
// already.
//
//	dabb.WithInterceptor(logCalls, dabb.CredentialCheck(checkSignature))
//
// A nil check returns nil, which WithInterceptor skips.
func CredentialCheck(check Interceptor) Interceptor {
	if check == nil {
		return nil
	}
	return func(ctx context.Context, info *CallInfo, next CallHandler) (any, error) {
		if info.open {
			return next(ctx)
		}
		return check(ctx, info, next)
	}
}

// StatusOf returns the status the server answers for err, an error a
// handler or interceptor returned. It is StatusOK for nil. A reply that
// then fails to encode is answered 25; no interceptor sees that.
func StatusOf(err error) protocol.Status {
	if err == nil {
		return protocol.StatusOK
	}
	s, _ := handlerStatus(err)
	return s
}

// PanicError is the error a panic in a handler or an interceptor becomes.
// The server logs it with its ID, value and stack. The caller gets only
// Error's text, "handler panic (id <ID>)", with status 70.
type PanicError struct {
	ID    string // 16 random hex digits, in the server's log line too
	Value any    // what was passed to panic
	Stack []byte // the panicking goroutine's stack
}

func (e *PanicError) Error() string { return "handler panic (id " + e.ID + ")" }

// panicked logs a recovered panic and returns its error. where names the
// handler or the interceptor that panicked, "interceptor 1" the first given.
func (s *Server) panicked(v any, info *CallInfo, where string) *PanicError {
	e := &PanicError{ID: fmt.Sprintf("%016x", rand.Uint64()), Value: v, Stack: debug.Stack()}
	s.log.Error("dabb: "+where+" panic", "id", e.ID, "service", info.Service, "method", info.Method,
		"panic", v, "stack", string(e.Stack))
	return e
}

// isNil reports a reply that is nil or a nil pointer. gRPC-Go refuses
// such a reply too: it is never a real one.
func isNil(reply any) bool {
	if reply == nil {
		return true
	}
	return reflect.TypeOf(reply).Kind() == reflect.Pointer && reflect.ValueOf(reply).IsNil()
}

// nilReplyError is the error of a nil reply with a nil error, made by who.
func nilReplyError(info *CallInfo, who string) error {
	return &protocol.Error{Status: protocol.StatusServiceError,
		Msg: info.Service + "." + info.Method + ": " + who + " returned a nil reply and a nil error"}
}

// invoke runs the method, recovering a panic into a *PanicError.
// oneWay tells a request no reply goes back to, which may be nil.
func (s *Server) invoke(ctx context.Context, svc *service, m *MethodDesc, dec func(any) error, oneWay bool) (reply any, err error) {
	defer func() {
		if v := recover(); v != nil {
			// A panic is recovered here, once: the interceptors around
			// see an error, and the transport's recover never fires.
			reply, err = nil, s.panicked(v, &CallInfo{Service: svc.name, Method: m.Name}, "handler")
		}
	}()
	reply, err = m.Handler(svc.impl, ctx, dec)
	if err == nil && !oneWay && isNil(reply) {
		return nil, nilReplyError(&CallInfo{Service: svc.name, Method: m.Name}, "handler")
	}
	return reply, err
}

// chainCall is one call's way through the interceptors. It is pooled with
// its CallHandlers, bound once, so a call allocates none.
type chainCall struct {
	s    *Server
	info CallInfo
	svc  *service
	m    *MethodDesc
	dec  func(any) error
	// oneWay is set for a request no reply goes back to.
	oneWay bool
	next   []CallHandler // next[i] runs interceptor i; next[len(chain)], the method
}

func newChainCall(s *Server) *chainCall {
	c := &chainCall{s: s, next: make([]CallHandler, len(s.chain)+1)}
	for i := range c.next {
		c.next[i] = func(ctx context.Context) (any, error) { return c.run(ctx, i) }
	}
	return c
}

// run runs interceptor i, or the method once past the last.
func (c *chainCall) run(ctx context.Context, i int) (reply any, err error) {
	if i == len(c.s.chain) {
		return c.s.invoke(ctx, c.svc, c.m, c.dec, c.oneWay)
	}
	defer func() {
		if v := recover(); v != nil {
			// next recovers its own panics: this one is the
			// interceptor's. The ones outside see an error.
			reply, err = nil, c.s.panicked(v, &c.info, fmt.Sprintf("interceptor %d", i+1))
		}
	}()
	reply, err = c.s.chain[i](ctx, &c.info, c.next[i+1])
	if err == nil && !c.oneWay && isNil(reply) {
		return nil, nilReplyError(&c.info, fmt.Sprintf("interceptor %d", i+1))
	}
	return reply, err
}

// handle runs the call through the interceptors, or straight to the
// method when there are none.
func (s *Server) handle(ctx context.Context, req *protocol.Message, svc *service, m *MethodDesc, dec func(any) error) (any, error) {
	oneWay := !req.Header.Flags().IsTwoWay()
	if len(s.chain) == 0 {
		return s.invoke(ctx, svc, m, dec, oneWay)
	}
	c := s.calls.Get().(*chainCall)
	c.info = CallInfo{Service: svc.name, Method: m.Name, Idempotent: m.Idempotent,
		Attachments: req.Attachments, IdempotencyKey: req.IdempotencyKey, open: svc.open}
	c.svc, c.m, c.dec, c.oneWay = svc, m, dec, oneWay
	reply, err := c.next[0](ctx)
	c.info, c.svc, c.m, c.dec = CallInfo{}, nil, nil, nil
	s.calls.Put(c)
	return reply, err
}
