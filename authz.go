// RequirePeerIdentity: the interceptor that admits calls by the client certificate's identity.

package dabb

import (
	"context"
	"crypto/x509"
	"strings"

	"github.com/dabbrpc/dabb/protocol"
)

// Identities lists the client identities RequirePeerIdentity admits. A
// call is admitted when its verified client certificate matches any one
// entry of any list. Empty lists admit nobody.
type Identities struct {
	// DNSNames are SAN DNS names, such as "payments.internal". They
	// match exactly, ignoring case; no wildcards.
	DNSNames []string
	// URIs are SAN URIs, such as "spiffe://example.org/payments". They
	// match exactly.
	URIs []string
	// Subjects are subject names as crypto/x509/pkix.Name.String prints
	// them, such as "CN=payments,O=Example". They match exactly.
	Subjects []string
}

// RequirePeerIdentity returns an Interceptor that admits a call only over
// mTLS, from a client whose verified certificate has an identity allow
// lists. It rejects the others before the handler runs, with status 40:
//
//   - no verified client certificate (a plaintext connection, or a
//     tls.Config that does not verify client certificates): Code
//     protocol.CodeUnauthenticated;
//   - a certificate with no allowed identity: Code
//     protocol.CodePermissionDenied.
//
// The server's tls.Config (WithTLS) must verify client certificates:
// ClientAuth tls.RequireAndVerifyClientCert or VerifyClientCertIfGiven.
// An unverified certificate is never looked at.
//
// It is a credential check (CredentialCheck): a call to the health
// service passes unchecked by default.
func RequirePeerIdentity(allow Identities) Interceptor {
	dns := make(map[string]struct{}, len(allow.DNSNames))
	for _, n := range allow.DNSNames {
		dns[strings.ToLower(n)] = struct{}{}
	}
	uris := make(map[string]struct{}, len(allow.URIs))
	for _, u := range allow.URIs {
		uris[u] = struct{}{}
	}
	subjects := make(map[string]struct{}, len(allow.Subjects))
	for _, s := range allow.Subjects {
		subjects[s] = struct{}{}
	}
	admits := func(cert *x509.Certificate) bool {
		if _, ok := subjects[cert.Subject.String()]; ok {
			return true
		}
		for _, n := range cert.DNSNames {
			if _, ok := dns[strings.ToLower(n)]; ok {
				return true
			}
		}
		for _, u := range cert.URIs {
			if _, ok := uris[u.String()]; ok {
				return true
			}
		}
		return false
	}
	return CredentialCheck(func(ctx context.Context, info *CallInfo, next CallHandler) (any, error) {
		p, _ := RemotePeer(ctx)
		if p.TLS == nil || len(p.TLS.VerifiedChains) == 0 || len(p.TLS.VerifiedChains[0]) == 0 {
			return nil, &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodeUnauthenticated,
				Msg: "dabb: " + info.Service + "." + info.Method + " requires a verified client certificate (mTLS)"}
		}
		// Every verified chain starts with the same leaf: the client's.
		cert := p.TLS.VerifiedChains[0][0]
		if !admits(cert) {
			return nil, &protocol.Error{Status: protocol.StatusBadRequest, Code: protocol.CodePermissionDenied,
				Msg: "dabb: the client certificate " + cert.Subject.String() + " may not call " + info.Service + "." + info.Method}
		}
		return next(ctx)
	})
}
