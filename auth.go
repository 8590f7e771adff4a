// Token checks: the interceptor that admits only calls with a valid bearer token.

package dabb

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"strings"
	"sync/atomic"

	"github.com/dabbrpc/dabb/protocol"
)

// AttachAuthorization is the attachment that carries a call's
// credentials, as HTTP's Authorization header does. A bearer token
// travels as "Bearer <token>"; the scheme is matched without case. It is
// protocol.AttachAuthorization, which proxy.BearerToken sends.
const AttachAuthorization = protocol.AttachAuthorization

// RequireToken returns an interceptor that admits a call only with one
// of tokens, as a TokenSet does. Its tokens are fixed: use a TokenSet to
// change them while serving. It is a credential check (CredentialCheck):
// a call to the health service passes unchecked by default.
//
//	dabb.NewServer(dabb.WithInterceptor(dabb.RequireToken(current, next)))
func RequireToken(tokens ...string) Interceptor { return NewTokenSet(tokens...).Intercept }

// TokenSet is a set of valid bearer tokens, replaceable while serving.
// Its Intercept method is the interceptor. Several tokens are valid at
// once, so a rotation needs no restart: add the new token, move the
// clients to it, then drop the old one.
//
//	tokens := dabb.NewTokenSet(current)
//	s := dabb.NewServer(dabb.WithInterceptor(tokens.Intercept))
//	tokens.Set(current, next) // clients move to next
//	tokens.Set(next)          // current is retired
//
// The zero TokenSet admits no call. Its methods may be called at once
// from several goroutines.
type TokenSet struct {
	digests atomic.Pointer[[][sha256.Size]byte]
}

// NewTokenSet returns a set holding tokens.
func NewTokenSet(tokens ...string) *TokenSet {
	ts := &TokenSet{}
	ts.Set(tokens...)
	return ts
}

// Set replaces the valid tokens. Empty tokens are ignored; with none
// left, every call is rejected. Calls checked from then on see the new
// set.
func (ts *TokenSet) Set(tokens ...string) {
	digests := make([][sha256.Size]byte, 0, len(tokens))
	for _, t := range tokens {
		if t != "" {
			digests = append(digests, sha256.Sum256([]byte(t)))
		}
	}
	ts.digests.Store(&digests)
}

// Intercept is an Interceptor and a credential check (CredentialCheck).
// It admits a call whose authorization attachment is "Bearer <token>"
// with a token of the set. It rejects any other call before the handler
// runs, with a *protocol.Error of status 40 and code
// protocol.CodeUnauthenticated. The message says whether the token was
// missing or wrong, never what it was. A call to the health service
// passes unchecked unless WithHealthCredentials(true) is given.
func (ts *TokenSet) Intercept(ctx context.Context, info *CallInfo, next CallHandler) (any, error) {
	if info.open {
		// A kubelet's probe sends no credentials: the server marks
		// health checks open unless WithHealthCredentials(true).
		return next(ctx)
	}
	if err := ts.check(info.Attachments[AttachAuthorization]); err != nil {
		return nil, err
	}
	return next(ctx)
}

// check returns nil when credentials hold a valid bearer token.
func (ts *TokenSet) check(credentials string) error {
	const scheme = "Bearer "
	if credentials == "" {
		return unauthenticated("missing credentials: no " + AttachAuthorization + " attachment")
	}
	if len(credentials) <= len(scheme) || !strings.EqualFold(credentials[:len(scheme)], scheme) {
		return unauthenticated("the " + AttachAuthorization + " attachment is not a bearer token")
	}
	// Digests have one length whatever the token's, so the comparison
	// tells nothing of it. Every token is compared, so the time does
	// not tell which one matched.
	got := sha256.Sum256([]byte(credentials[len(scheme):]))
	match := 0
	if digests := ts.digests.Load(); digests != nil {
		for i := range *digests {
			match |= subtle.ConstantTimeCompare(got[:], (*digests)[i][:])
		}
	}
	if match != 1 {
		return unauthenticated("invalid bearer token")
	}
	return nil
}

func unauthenticated(msg string) error {
	return &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodeUnauthenticated, Msg: msg}
}
