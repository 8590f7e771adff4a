// The client's options: Option, the With* functions and their defaults.

package proxy

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// DefaultTimeout is a call's timeout when nothing sets one: one second, as
// in Dubbo.
const DefaultTimeout = time.Second

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

// defaultOptions returns the options of a client given none. The zero
// values of the rest (transport, cache, retry, breaker) mean defaults too.
func defaultOptions() options {
	return options{codec: "proto", timeout: DefaultTimeout, idempotencyKeys: true}
}

// WithCodec chooses the serialization by name (default "proto"). Its
// package must be imported so it is registered; NewClient fails if not.
// This package imports "proto" and "json" itself.
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

// WithTransport configures the connection pool: connections per address,
// dial timeout, heartbeats, body limit. Fields left zero take their
// defaults (see transport.Config). A nil TLS keeps the one WithTLS gave.
func WithTransport(cfg transport.Config) Option {
	return func(o *options) {
		if cfg.TLS == nil {
			cfg.TLS = o.transport.TLS
		}
		o.transport = cfg
	}
}

// MetadataTLSServerName is the instance metadata key naming the server a
// TLS client verifies the instance's certificate against. Without it the
// name is the host of the instance's address. It lets an instance
// published by IP present a certificate for a name.
const MetadataTLSServerName = "tls_server_name"

// WithTLS makes every connection TLS, with cfg cloned for each dial. The
// handshake is part of the dial, within the transport's DialTimeout. A
// failed handshake fails the attempt not sent, with an error naming TLS
// and the cause, and the attempt is retried elsewhere by the usual rule.
// When cfg.ServerName is empty, each instance is verified against its
// MetadataTLSServerName value, or the host of its address. Verification
// is skipped only if cfg sets InsecureSkipVerify. Set cfg.Certificates or
// cfg.GetClientCertificate for mTLS; the hook runs on every handshake, so
// a rotated certificate is used from the next connection on. Default
// none: plaintext.
func WithTLS(cfg *tls.Config) Option { return func(o *options) { o.transport.TLS = cfg } }

// WithCache configures the instance cache: snapshot file, empty-push
// protection. Fields left zero take their defaults (see
// registry.CacheConfig).
func WithCache(cfg registry.CacheConfig) Option { return func(o *options) { o.cache = cfg } }

// WithBalancer chooses the load balancer (balancer.P2C by default) for every
// service, or, with services named, for those only. NewClient fails for a
// name balancer.New does not know.
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

// WithRetry sets the retry policy. Fields left zero take their defaults
// (see RetryPolicy).
func WithRetry(p RetryPolicy) Option { return func(o *options) { o.retry = p } }

// WithBreaker configures the per-instance circuit breakers. Fields left
// zero take their defaults (see BreakerConfig).
func WithBreaker(cfg BreakerConfig) Option { return func(o *options) { o.breaker = cfg } }

// WithObserver reports every attempt, retry and breaker change to obs.
// proxy/prometheus has one that exports Prometheus metrics.
func WithObserver(obs Observer) Option { return func(o *options) { o.observer = obs } }

// WithoutIdempotencyKeys turns the idempotency keys off. By default each
// call of a method that is not idempotent gets a key, which every attempt
// repeats (the protocol.AttachIdempotencyKey attachment).
func WithoutIdempotencyKeys() Option { return func(o *options) { o.idempotencyKeys = false } }

// WithCredentials adds c's attachments to every call, under the keys c
// returns. When c requires transport security, a client without WithTLS
// fails every call unsent. It runs as a middleware, where the option stands
// among WithMiddleware: middlewares given after it see the attachments,
// those given before do not. Several WithCredentials add up, in order.
func WithCredentials(c Credentials) Option {
	return func(o *options) {
		o.middleware = append(o.middleware, credentialsStage(c, o))
	}
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.logger = l } }
