// Options of a Server: its transport, logger and registry publishing.

package dabb

import (
	"log/slog"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/transport"
)

// Option configures a Server.
type Option func(*options)

type options struct {
	transport  transport.ServerConfig
	registry   registry.Registry
	advertise  string
	weight     int
	metadata   map[string]string
	regTimeout time.Duration
	lazy       bool // WithRegistryCheck(false)
}

// WithMaxConcurrent bounds the requests running at once; a request over the
// bound is answered at once with status 100 (overloaded), never queued.
// Default 10000.
func WithMaxConcurrent(n int) Option { return func(o *options) { o.transport.MaxConcurrent = n } }

// WithMaxBody limits the body of an incoming request (default 8 MiB). A
// larger request is dropped and answered with 40, and the connection stays;
// only a header claiming more than 64 MiB closes it. A handler's answer
// over the limit is replaced by status 50 (bad response) saying so; raise
// it with the clients' transport.Config.MaxBody to send larger answers.
func WithMaxBody(n uint32) Option { return func(o *options) { o.transport.MaxBody = n } }

// WithHeartbeat sets the idle interval after which a connection is probed
// (default 60 s); a peer silent for three intervals is disconnected.
func WithHeartbeat(d time.Duration) Option {
	return func(o *options) { o.transport.HeartbeatInterval = d }
}

// WithWaitForHandlers makes Close, and a Shutdown whose ctx ends first,
// wait for running handlers to return after cancelling their contexts.
// By default they return once the connections are closed (as net/http's
// Shutdown and gRPC's Stop do), so a handler that ignores its context
// cannot hold the process up; it runs on, and its answer goes nowhere.
func WithWaitForHandlers(wait bool) Option {
	return func(o *options) { o.transport.WaitForHandlers = wait }
}

// WithLogger sets the logger (default slog.Default()).
func WithLogger(l *slog.Logger) Option { return func(o *options) { o.transport.Logger = l } }

// WithRegistry publishes every registered service to r once the server
// listens, and withdraws it when the server shuts down, before draining.
func WithRegistry(r registry.Registry) Option { return func(o *options) { o.registry = r } }

// WithAdvertiseAddr sets the host:port published to the registry. By default
// it is the listener's address, with an unspecified host (0.0.0.0, ::)
// replaced by this machine's first non-loopback, non-link-local address
// (IPv4 preferred), or 127.0.0.1 when it has none: set the address then.
func WithAdvertiseAddr(addr string) Option { return func(o *options) { o.advertise = addr } }

// WithRegistryCheck sets what Serve does when the registry cannot be
// reached (an error wrapping registry.ErrUnavailable, or the registry
// timeout) as it publishes, like Dubbo's registry check. With true, the
// default, Serve publishes before it accepts, and fails if it cannot: a
// server nobody can find says so at start. With false, Serve accepts at
// once and publishes in the background, retrying with backoff while the
// registry cannot be reached, until it succeeds or the server stops, so a
// server restarted during a registry outage serves whoever knows its
// address and appears once the registry is back. Other publishing errors
// (the registry refuses the instance) are logged, and the server serves
// unpublished.
func WithRegistryCheck(check bool) Option { return func(o *options) { o.lazy = !check } }

// WithInstance sets the weight and metadata published with each instance.
func WithInstance(weight int, metadata map[string]string) Option {
	return func(o *options) { o.weight, o.metadata = weight, metadata }
}
