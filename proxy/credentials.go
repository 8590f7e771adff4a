// Per-call credentials: the Credentials interface, the stage that adds them to a call, and BearerToken.

package proxy

import (
	"context"
	"errors"
	"fmt"

	"github.com/dabbrpc/dabb/protocol"
)

// Credentials supply attachments for every call: a bearer token, a
// signature. They have the shape of gRPC's PerRPCCredentials. Give them to
// a client with WithCredentials.
type Credentials interface {
	// Attachments returns the attachments to add to a call of
	// service.method. ctx is the call's, bounded by its deadline. It is
	// called once per call, before the first attempt: every attempt and
	// hedge carries the same values. An error fails the call unsent.
	Attachments(ctx context.Context, service, method string) (map[string]string, error)
	// RequireTransportSecurity reports whether the attachments may travel
	// only over TLS. A client without TLS then fails every call unsent.
	// Return false only for values that are safe to show an eavesdropper,
	// such as a signature that names its call and its time.
	RequireTransportSecurity() bool
}

// ErrInsecureCredentials is the cause of a call refused because its
// credentials require transport security and the client has no TLS. The
// call was not sent (ErrNotSent, status 90).
var ErrInsecureCredentials = errors.New("proxy: credentials require transport security")

// credentialsStage is the middleware WithCredentials adds. o is the
// client's own options, read at call time: a WithTLS given after
// WithCredentials still counts.
func credentialsStage(c Credentials, o *options) Middleware {
	return func(next Invoker) Invoker {
		return func(ctx context.Context, call *Call) error {
			if err := addCredentials(ctx, c, o.transport.TLS != nil, call); err != nil {
				return err
			}
			return next(ctx, call)
		}
	}
}

// addCredentials adds c's attachments to call, or returns the unsent
// error of a call that must not go out. secure says the client uses TLS.
func addCredentials(ctx context.Context, c Credentials, secure bool, call *Call) error {
	if !secure && c.RequireTransportSecurity() {
		msg := "credentials (" + credentialsName(c) + ") require TLS and the client has none (proxy.WithTLS): " +
			call.Service + "." + call.Method + " not sent"
		return protocol.NotSent(protocol.StatusClientError, msg, &quietError{msg, []error{ErrInsecureCredentials}})
	}
	if dl, ok := ctx.Deadline(); !ok || dl.After(call.Deadline) {
		// A source that fetches a token must not outlive the call.
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, call.Deadline)
		defer cancel()
	}
	att, err := c.Attachments(ctx, call.Service, call.Method)
	if err != nil {
		status := protocol.StatusClientError
		if errors.Is(err, context.DeadlineExceeded) {
			status = protocol.StatusClientTimeout
		}
		return protocol.NotSent(status, "credentials ("+credentialsName(c)+") for "+call.Service+"."+call.Method, err)
	}
	for k, v := range att {
		if k == protocol.AttachTimeout || k == protocol.AttachIdempotencyKey {
			return protocol.NotSent(protocol.StatusClientError, "credentials ("+credentialsName(c)+") for "+
				call.Service+"."+call.Method+" set the reserved attachment "+k, nil)
		}
		call.SetAttachment(k, v)
	}
	return nil
}

// credentialsName names c in errors: its String method, else its type.
func credentialsName(c Credentials) string {
	if s, ok := c.(fmt.Stringer); ok {
		return s.String()
	}
	return fmt.Sprintf("%T", c)
}

// BearerToken returns credentials that send the attachment
// "authorization" (protocol.AttachAuthorization) as "Bearer <token>". It
// calls source on every call, with the call's context, so a token that
// refreshes is sent as soon as source returns it. Caching is source's
// job: golang.org/x/oauth2's ReuseTokenSource, say, or a token read from a
// file that a sidecar rewrites. An error or an empty token fails the call
// unsent. The credentials require transport security.
func BearerToken(source func(ctx context.Context) (string, error)) Credentials {
	return bearerToken{source}
}

type bearerToken struct {
	source func(ctx context.Context) (string, error)
}

func (b bearerToken) Attachments(ctx context.Context, _, _ string) (map[string]string, error) {
	tok, err := b.source(ctx)
	if err != nil {
		return nil, err
	}
	if tok == "" {
		return nil, errors.New("the token source returned an empty token")
	}
	return map[string]string{protocol.AttachAuthorization: "Bearer " + tok}, nil
}

func (bearerToken) RequireTransportSecurity() bool { return true }

func (bearerToken) String() string { return "bearer token" }
