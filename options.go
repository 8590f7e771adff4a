// Options of a Server: its transport, logger, interceptors and registry publishing.

package dabb

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// Option configures a Server.
type Option func(*options)

type options struct {
	transport  transport.ServerConfig
	logger     *slog.Logger
	registry   registry.Registry
	advertise  string
	weight     int
	metadata   map[string]string
	regTimeout time.Duration
	lazy       bool // WithRegistryCheck(false)
	drainDelay time.Duration

	noReflection      bool // WithoutReflection
	healthCredentials bool // WithHealthCredentials(true)
	laxJSON           bool // WithLaxJSON

	interceptors []Interceptor
}

// WithTransport configures the connections and the requests they carry:
// the concurrency bound, body limit, heartbeats, shutdown linger and
// whether Close waits for handlers. A zero field keeps its default; see
// transport.ServerConfig for each. A nil Logger gets the server's logger.
// A nil TLS keeps the one WithTLS gave, a nil Observer the one
// WithObserver gave.
func WithTransport(cfg transport.ServerConfig) Option {
	return func(o *options) {
		if cfg.TLS == nil {
			cfg.TLS = o.transport.TLS
		}
		if cfg.Observer == nil {
			cfg.Observer = o.transport.Observer
		}
		o.transport = cfg
	}
}

// WithTLS makes the server speak TLS on every listener, Serve's and
// ListenAndServe's: Serve wraps the plain listener it is given. For mTLS,
// set cfg's ClientAuth to tls.RequireAndVerifyClientCert and its
// ClientCAs; RemotePeer then tells a handler the client's verified
// certificate. The hooks GetCertificate and GetConfigForClient run on
// every handshake, so certificates rotate without a restart. Each
// handshake runs on its connection's goroutine, within
// transport.ServerConfig.HandshakeTimeout. Default none: plaintext.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.transport.TLS = cfg } }

// WithLogger sets the logger of the server and of its transport, unless
// WithTransport gave the transport its own. Default slog.Default().
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }

// WithRegistry publishes every registered service to r once the server
// listens. Shutdown and Close withdraw them before the server drains.
// Default none: the server publishes nothing.
func WithRegistry(r registry.Registry) Option { return func(o *options) { o.registry = r } }

// WithAdvertiseAddr sets the host:port published to the registry. By
// default it is the listener's address. An unspecified host (0.0.0.0, ::)
// becomes this machine's first address that is neither loopback nor
// link-local, IPv4 first. A machine with none publishes 127.0.0.1: set
// the address then.
func WithAdvertiseAddr(addr string) Option { return func(o *options) { o.advertise = addr } }

// WithRegistryCheck sets what Serve does when the registry cannot be
// reached as it publishes, like Dubbo's registry check. Unreachable means
// an error wrapping registry.ErrUnavailable, or the 5 s registry timeout.
//
// With true, the default, Serve publishes before it accepts, and fails if
// it cannot. A server nobody can find says so at start.
//
// With false, Serve accepts at once and publishes in the background. It
// retries with backoff while the registry cannot be reached, until it
// succeeds or the server stops. A server restarted during a registry
// outage thus serves whoever knows its address, and appears once the
// registry is back. Other publishing errors (the registry refuses the
// instance) are logged, and the server serves unpublished.
func WithRegistryCheck(check bool) Option { return func(o *options) { o.lazy = !check } }

// WithInstance sets the weight and metadata published with each instance.
// Default weight 0, read as registry.DefaultWeight, and no metadata.
func WithInstance(weight int, metadata map[string]string) Option {
	return func(o *options) { o.weight, o.metadata = weight, metadata }
}

// WithInterceptor adds interceptors around every call the server serves.
// Repeated, it appends. The first given is the outermost: it runs first
// and sees the outcome last. A nil interceptor is skipped. Default none:
// a call goes straight to its handler, at no extra cost. The log names a
// panicking one "interceptor N", the first given being 1.
//
//	dabb.NewServer(dabb.WithInterceptor(logCalls, dabb.RequireToken(token)))
func WithInterceptor(is ...Interceptor) Option {
	return func(o *options) {
		for _, i := range is {
			if i != nil {
				o.interceptors = append(o.interceptors, i)
			}
		}
	}
}

// WithHealthCredentials sets whether the health service (dabb.Health)
// runs the credential checks: RequireToken, TokenSet.Intercept,
// RequirePeerIdentity and the interceptors given to CredentialCheck.
//
// With false, the default, a health check needs no credentials, as a
// kubelet's gRPC probe sends none. The other interceptors (logging,
// metrics) still run for it. The TLS handshake is not skipped: a server
// that requires client certificates requires them of a probe too.
//
// With true, a health check needs the credentials any call needs.
// Every other service, dabb.Reflection among them, always runs every
// interceptor.
func WithHealthCredentials(required bool) Option {
	return func(o *options) { o.healthCredentials = required }
}

// WithDrainDelay makes Shutdown wait d after it withdrew the server from
// the registry, before it stops accepting and tells clients it is
// read-only. Meanwhile the server serves as before, and its health
// service answers not serving. Clients that learn of the withdrawal from
// the registry stop choosing the server on their own, and probes and
// operators see it leave. The wait ends early when Shutdown's ctx does.
// Default 0: no wait. Dubbo's providers and a Kubernetes preStop hook
// wait likewise.
func WithDrainDelay(d time.Duration) Option { return func(o *options) { o.drainDelay = max(d, 0) } }

// WithoutReflection turns off the built-in reflection service,
// dabb.Reflection (see package reflection). Default on: every server
// answers List and Describe, through its interceptors like any service,
// and never publishes it to the registry. Without it, a call to
// dabb.Reflection is answered 60 (service not found).
func WithoutReflection() Option { return func(o *options) { o.noReflection = true } }

// WithLaxJSON makes the server ignore a JSON request's object members
// that the request type has no field for, as encoding/json does. By
// default such a request is refused with status 40 before the handler
// runs, and the message names the member: json: unknown field "customr".
// A typo in a field name is thus an error, not a field left empty. Turn
// it on while clients that send a new field reach servers that do not
// know it yet. Replies are lax whatever the option. It applies to every
// codec that implements codec.Strict; of dabb's, the JSON codec alone.
func WithLaxJSON() Option { return func(o *options) { o.laxJSON = true } }

// WithObserver reports to obs what the server does outside its
// interceptors: the requests it refuses before them, and the connections
// it opens and closes. The transport reports overload, shutdown, a spent
// budget and frames it cannot read; the server reports a serialization
// it did not import (transport.RejectBadRequest) and a service or method
// it does not have (transport.RejectUnimplemented). The calls that reach
// the interceptors are theirs to observe (WithInterceptor). Package
// github.com/dabbrpc/dabb/prometheus implements both. Default none:
// nothing is reported, at no cost.
func WithObserver(obs transport.ServerObserver) Option {
	return func(o *options) { o.transport.Observer = obs }
}
