// Server interceptors: the types of the chain around every call a Server serves.

package dabb

import "context"

// CallInfo describes the call an Interceptor wraps. Its maps and strings
// are the request's: read them, do not modify them, and do not keep them
// after the call returns.
type CallInfo struct {
	Service    string
	Method     string
	Idempotent bool // the method is marked //dabb:idempotent
	// Attachments are the request's attachments; nil when it has none.
	Attachments map[string]string
	// IdempotencyKey is the request's key; empty when it has none.
	IdempotencyKey string
}

// CallHandler runs the rest of the chain and then the method: it decodes
// the request, calls the implementation and returns its reply.
type CallHandler func(ctx context.Context) (reply any, err error)

// Interceptor wraps every call a Server serves. It may reject the call by
// returning an error without calling next; the handler then never runs.
// It may call next and observe the reply, the error and the time taken.
// It runs before the request is decoded, so a rejected call costs no
// decoding. RemotePeer(ctx) tells who called.
type Interceptor func(ctx context.Context, info *CallInfo, next CallHandler) (reply any, err error)
