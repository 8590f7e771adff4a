// The Pool's Config: its fields, their defaults and ranges.

package transport

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// Config configures a Pool. The zero value works. docs/performance.md
// holds the measurements behind the defaults.
type Config struct {
	// ConnsPerAddr is the number of connections kept to each address.
	// Calls are spread over them round robin. Default 2.
	ConnsPerAddr int

	// LargeMessage is the payload size, in bytes, from which a request is
	// large. Large requests to an address share a connection of their own,
	// so they never queue in front of small calls. Default 64 KiB;
	// negative sends every request over the shared connections.
	LargeMessage int

	// LargeInFlight bounds the large requests in flight to one address
	// beside small calls: while some wait for answers, or when some were
	// made since the previous large request. The next one then waits for
	// a slot, and the wait counts against its budget. A slot is held until
	// the response arrives, handler time included. Alone on the address,
	// a large request finding no free slot goes without one. Default 1;
	// negative means no bound. Calls that loop back (A to
	// B to A, all large, beside small ones) want a larger bound or none.
	// See docs/performance.md, finding 5.
	LargeInFlight int

	// LargeShare is the share of time large requests to one address may
	// take while small calls to it wait for answers. After a large round
	// trip of d, the next waits d·(1−LargeShare)/LargeShare, at most
	// 100 ms, within its budget. Without small calls in flight there is no
	// pause. Default 0: the share adapts (LargeSlowdown), from 0.25,
	// between 0.05 and 1. A share in (0, 1) is fixed; 1 or more, or
	// negative, turns pacing off. See docs/performance.md, finding 5.
	LargeShare float64

	// LargeSlowdown is the small calls' p99 latency, as a multiple of
	// their p99 with no large request in flight, that an adaptive
	// LargeShare aims at. Once a large request has gone to an address, the
	// pool times one small call in 2 to it. Over the target the share
	// narrows; well under it the share widens. Default 2.5; 1 or less,
	// with LargeShare 0, fixes the share at 0.25.
	LargeSlowdown float64

	// DialTimeout bounds one dial. Default 3s.
	DialTimeout time.Duration

	// HeartbeatInterval is how long a connection may read nothing before
	// it sends a heartbeat. One silent for 3 intervals is closed.
	// Default 60s.
	HeartbeatInterval time.Duration

	// MaxBody bounds response bodies and request payloads, in bytes. A
	// larger response fails its call alone with a local 50 (the server ran
	// it); one claiming over 64 MiB closes the connection. A larger request
	// fails at once, not sent: 90 wrapping protocol.ErrBodyTooLarge.
	// Default protocol.DefaultMaxBody.
	MaxBody uint32

	// Serializations, when set, says which serialization ids responses
	// may come in. A response in another one shows a peer that is not a
	// dabb server (a Dubbo provider answering in hessian2): its call fails
	// with a local 50 naming the serialization, and the connection closes.
	// proxy.Client sets it to the codecs dabb has. Default nil: every id.
	Serializations func(id byte) bool

	// Dial opens a connection. Default: a net.Dialer over TCP.
	Dial func(ctx context.Context, addr string) (net.Conn, error)

	// TLS, when set, makes every connection TLS. The handshake is part of
	// the dial, within DialTimeout, and a failed one fails its calls not
	// sent. Each dial clones TLS, so its hooks (GetClientCertificate) run
	// on every handshake. An empty ServerName is set per address (see
	// ServerName); verification is skipped only with InsecureSkipVerify.
	// Default nil: plaintext.
	TLS *tls.Config

	// ServerName returns the name a TLS dial to addr verifies the
	// server's certificate against, when TLS.ServerName is empty. An empty
	// answer, or a nil ServerName, means addr's host. It runs on the
	// dialing goroutine and must not block.
	ServerName func(addr string) string

	// OnReadOnly is called when addr sends the read-only event: it is
	// shutting down. It runs on a connection's reader and must not block.
	OnReadOnly func(addr string)

	// OnBack is called when a read-only address has a usable connection
	// again: a server restarted there. It runs on the dialing goroutine and
	// must not block.
	OnBack func(addr string)

	// Logger receives connection events. Nil means slog.Default().
	Logger *slog.Logger
}

// withDefaults returns cfg with its zero fields set to their defaults.
func (cfg Config) withDefaults() Config {
	if cfg.LargeMessage == 0 {
		cfg.LargeMessage = 64 << 10
	}
	if cfg.ConnsPerAddr <= 0 {
		cfg.ConnsPerAddr = 2
	}
	if cfg.LargeInFlight == 0 {
		cfg.LargeInFlight = 1
	}
	if cfg.LargeSlowdown == 0 {
		cfg.LargeSlowdown = 2.5
	}
	if cfg.LargeShare == 0 && cfg.LargeSlowdown <= 1 {
		cfg.LargeShare = initialShare
	}
	if cfg.DialTimeout <= 0 {
		cfg.DialTimeout = 3 * time.Second
	}
	if cfg.HeartbeatInterval <= 0 {
		cfg.HeartbeatInterval = 60 * time.Second
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = protocol.DefaultMaxBody
	}
	if cfg.Dial == nil {
		var d net.Dialer
		cfg.Dial = func(ctx context.Context, addr string) (net.Conn, error) {
			return d.DialContext(ctx, "tcp", addr)
		}
	}
	return cfg
}
