// The Server's ServerConfig: its fields, their defaults and ranges.

package transport

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// ServerConfig configures a Server. The zero value works.
type ServerConfig struct {
	// MaxConcurrent bounds the requests running at once on the server.
	// A request over it is answered at once with status 100, never queued.
	// Default 10000; zero or less means the default.
	MaxConcurrent int

	// MaxBody limits the body of a request and of a response, in bytes.
	// A larger request is dropped and answered with status 40. One that
	// claims over 64 MiB closes its connection. A larger response is
	// replaced by status 50. Default (zero) protocol.DefaultMaxBody.
	MaxBody uint32

	// Serializations, when set, says which serialization ids the server
	// reads. A request in another one (a Dubbo peer's hessian2, say) is
	// answered with status 40, its body unread. The error is written as
	// Dubbo writes one in that serialization (protocol.AppendForeignError).
	// dabb.Server sets it to the codecs the program imported.
	// Default nil: every id.
	Serializations func(id byte) bool

	// HeartbeatInterval is how long a connection reads nothing before it
	// sends a heartbeat. One silent for 3 intervals is closed.
	// Default 60s; zero or less means the default.
	HeartbeatInterval time.Duration

	// ShutdownLinger bounds how long Shutdown waits, after the last
	// handler, for clients to close their connections. Requests arriving
	// meanwhile get status 100 and do not run. A dabb Pool closes its
	// connection once its last call is answered, so the wait is short.
	// Default 2s; zero or less means the default.
	ShutdownLinger time.Duration

	// WaitForHandlers makes Close, and a Shutdown whose ctx ends, wait
	// for the running handlers to return. By default they are left to
	// return on their own, as net/http's Shutdown and gRPC's Stop do.
	// Default false.
	WaitForHandlers bool

	// TLS, when set, makes the server speak TLS on every listener, as a
	// tls.NewListener would. Set ClientAuth and ClientCAs for mTLS. Its
	// hooks (GetCertificate, GetConfigForClient) run on every handshake,
	// so certificates rotate without a restart. Default nil: plaintext.
	TLS *tls.Config

	// HandshakeTimeout bounds a TLS handshake. It runs on the
	// connection's goroutine, never in the accept loop. Default 10s;
	// zero or less means the default.
	HandshakeTimeout time.Duration

	// MaxConns bounds the connections the server holds at once.
	// Default 10000; zero or less means the default.
	//
	// At MaxConns a new connection is admitted by closing another one.
	// The server closes, first, the oldest connection that has not
	// completed a valid frame within 1s of its accept (or half of
	// FirstFrameTimeout, if less). Then, of those with no call in flight,
	// the oldest that never made a call. Then the one that has waited
	// longest since its last answer, if more than that 1s. Then the
	// oldest of those just accepted and still without a valid frame.
	// Last, one whose last answer left within that 1s. A call is in flight from
	// its request, read whole, until its answer. A connection with a call
	// in flight is never closed to make room. When every connection has
	// one, the new connection is closed as soon as it is accepted, the
	// Observer is told (RejectMaxConns), and the log says so at most once
	// a second. While the server shuts down it closes no connection to
	// make room.
	MaxConns int

	// BodyBudget bounds the bytes of the request bodies over 64 KiB that
	// the server receives at once, over all connections. A body that does
	// not fit waits, before any of it is read: its connection alone stops
	// reading. Smaller bodies and events never wait. Default 4 × MaxBody;
	// less than MaxBody means MaxBody.
	BodyBudget int64

	// FirstFrameTimeout bounds how long a connection may go without a
	// valid frame after it was accepted (after its TLS handshake, if any).
	// Then it is closed. Default 10s; zero or less means the default.
	FirstFrameTimeout time.Duration

	// FrameReadTimeout bounds the reading of one frame, from its first
	// byte to its last. A connection whose header or body takes longer is
	// closed. Time spent waiting for BodyBudget does not count.
	// Default 30s; zero or less means the default.
	FrameReadTimeout time.Duration

	// Logger receives connection events and handler panics.
	// Default slog.Default().
	Logger *slog.Logger

	// Observer, when set, is told of the requests the server refuses
	// before their handler and of the connections it opens and closes.
	// Default nil: nothing is reported, at no cost.
	Observer ServerObserver

	// noInline sends every request to a worker, as before calls ran on
	// their reader (tests and benchmarks compare the two).
	noInline bool
	// inlineQuick replaces the const of that name when positive (tests).
	inlineQuick time.Duration
	// inlinePeriod replaces the const of that name when positive (tests
	// that must not see the watch move a call on a loaded machine).
	inlinePeriod time.Duration
	// burstGap replaces the const of that name when positive (tests).
	burstGap time.Duration
}

// withDefaults returns cfg with every unset field at its default.
func (cfg ServerConfig) withDefaults() ServerConfig {
	if cfg.inlineQuick <= 0 {
		cfg.inlineQuick = inlineQuick
	}
	if cfg.burstGap <= 0 {
		cfg.burstGap = burstGap
	}
	if cfg.inlinePeriod <= 0 {
		cfg.inlinePeriod = inlinePeriod
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 10000
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = protocol.DefaultMaxBody
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 60 * time.Second
	}
	if cfg.ShutdownLinger <= 0 {
		cfg.ShutdownLinger = 2 * time.Second
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 10 * time.Second
	}
	if cfg.BodyBudget <= 0 {
		cfg.BodyBudget = 4 * int64(cfg.MaxBody)
	}
	cfg.BodyBudget = max(cfg.BodyBudget, int64(cfg.MaxBody))
	if cfg.MaxConns <= 0 {
		cfg.MaxConns = 10000
	}
	if cfg.FirstFrameTimeout <= 0 {
		cfg.FirstFrameTimeout = 10 * time.Second
	}
	if cfg.FrameReadTimeout <= 0 {
		cfg.FrameReadTimeout = 30 * time.Second
	}
	return cfg
}
