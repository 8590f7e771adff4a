// The ZooKeeper session: connecting, reconnecting and reporting outages.

package zk

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
)

// sessionState is the client connection and what the registry knows of
// its session. Close, the dial and the session events change it.
type sessionState struct {
	mu       sync.Mutex // guards following
	closed   bool
	conn     *zk.Conn
	dialing  *dial
	stateCh  chan struct{} // closed and replaced on each session state change
	live     bool          // the client has a session (as of its last session event)
	down     bool          // the session has been down for the session timeout: watchers reported it
	downAt   *time.Timer   // reports the outage once the session has been down for the session timeout
	downs    int           // counts session losses; downAt reports only the latest
	watchers map[*watcher]struct{}
}

// isClosed reports whether Close has begun.
func (r *Registry) isClosed() bool {
	select {
	case <-r.done:
		return true
	default:
		return false
	}
}

// dial is one attempt to create the client connection.
type dial struct {
	done chan struct{}
	conn *zk.Conn
	err  error
}

// SessionTimeout returns the session timeout ZooKeeper granted for the
// current session, or the latest one. It may differ from the one
// Config.SessionTimeout asked for, which it returns before the first
// session. ZooKeeper expires a session it has not heard from for that
// long, and the registry times its outage reports by it.
func (r *Registry) SessionTimeout() time.Duration {
	if t := r.dialer.sessionTimeout(); t > 0 {
		return t
	}
	return r.cfg.SessionTimeout
}

// Unreachable implements registry.Reachability. It returns an error when
// the client has no connection to ZooKeeper and its latest one broke (the
// server closed it or went silent), or its latest attempt to connect
// failed. The error wraps ErrNoSession, and so registry.ErrUnavailable,
// and names the servers and why. Unreachable returns nil when the client
// is connected (with or without a session yet), has not tried yet, or is
// closed.
func (r *Registry) Unreachable() error {
	r.sess.mu.Lock()
	conn, closed := r.sess.conn, r.sess.closed
	r.sess.mu.Unlock()
	if conn == nil || closed {
		return nil
	}
	switch st := conn.State(); st {
	case zk.StateDisconnected, zk.StateConnecting:
		if err := r.dialer.lastFailure(); err != nil {
			return fmt.Errorf("%w: %s unreachable: %w", ErrNoSession, strings.Join(r.cfg.Servers, ","), err)
		}
	}
	return nil
}

// session returns the connection once it has a live session, waiting at
// most until ctx ends.
func (r *Registry) session(ctx context.Context) (*zk.Conn, error) {
	conn, err := r.connect(ctx)
	if err != nil {
		return nil, err
	}
	if err := r.waitSession(ctx, conn); err != nil {
		return nil, err
	}
	return conn, nil
}

// waitSession waits until conn has a live session.
func (r *Registry) waitSession(ctx context.Context, conn *zk.Conn) error {
	for {
		r.sess.mu.Lock()
		ch, closed := r.sess.stateCh, r.sess.closed
		r.sess.mu.Unlock()
		if closed {
			return registry.ErrClosed
		}
		st := conn.State()
		if st == zk.StateHasSession {
			return nil
		}
		select {
		case <-ch:
		case <-r.done:
			return registry.ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("%w (servers %s, state %v): %w", ErrNoSession, strings.Join(r.cfg.Servers, ","), st, ctx.Err())
		}
	}
}

// connect returns the client connection, creating it on first use.
// Creating it resolves the server names, which is why it runs on its own
// goroutine, bounded by ctx.
func (r *Registry) connect(ctx context.Context) (*zk.Conn, error) {
	r.sess.mu.Lock()
	if r.sess.closed {
		r.sess.mu.Unlock()
		return nil, registry.ErrClosed
	}
	if r.sess.conn != nil {
		conn := r.sess.conn
		r.sess.mu.Unlock()
		return conn, nil
	}
	d := r.sess.dialing
	if d == nil {
		d = &dial{done: make(chan struct{})}
		r.sess.dialing = d
		r.wg.Add(1)
		go r.dial(d)
	}
	r.sess.mu.Unlock()
	select {
	case <-d.done:
		if d.err != nil {
			return nil, d.err
		}
		return d.conn, nil
	case <-ctx.Done():
		return nil, fmt.Errorf("%w (connecting to %s): %w", ErrNoSession, strings.Join(r.cfg.Servers, ","), ctx.Err())
	case <-r.done:
		return nil, registry.ErrClosed
	}
}

func (r *Registry) dial(d *dial) {
	defer r.wg.Done()
	defer close(d.done)
	conn, events, err := zk.Connect(r.cfg.Servers, r.cfg.SessionTimeout,
		zk.WithDialer(r.dialer.dial),
		zk.WithLogger(clientLogger{r.log}),
		zk.WithLogInfo(false),
		zk.WithEventCallback(r.onEvent))
	r.sess.mu.Lock()
	if err != nil {
		d.err = fmt.Errorf("zk: connect to %s: %w", strings.Join(r.cfg.Servers, ","), err)
		r.sess.dialing = nil // the next call tries again
		r.sess.mu.Unlock()
		return
	}
	if r.sess.closed {
		r.sess.mu.Unlock()
		d.err = registry.ErrClosed
		// Not under r.sess.mu: the client calls onEvent while it shuts down.
		conn.Close()
		r.dialer.closeAll()
		for range events {
		}
		return
	}
	r.sess.conn, d.conn = conn, conn
	r.wg.Add(3)
	go r.readEvents(conn, events)
	go r.keep(conn)
	go r.guard(conn)
	r.sess.mu.Unlock()
}

// onEvent is called by the client, in order, for every event, before it
// tries to queue it on the (small, lossy) event channel. It must not
// block.
func (r *Registry) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		r.onNodeEvent(ev)
		return
	}
	r.sess.mu.Lock()
	close(r.sess.stateCh)
	r.sess.stateCh = make(chan struct{})
	switch {
	case ev.State == zk.StateHasSession:
		r.sess.live, r.sess.down = true, false
		if r.sess.downAt != nil {
			r.sess.downAt.Stop()
			r.sess.downAt = nil
		}
	case r.sess.live && !r.sess.closed:
		r.sess.live = false
		r.sess.downs++
		n := r.sess.downs
		// ZooKeeper expires the session after the timeout it granted,
		// not the one asked for.
		r.sess.downAt = time.AfterFunc(r.SessionTimeout(), func() { r.outage(n) })
	}
	r.sess.mu.Unlock()
	if ev.State == zk.StateHasSession {
		r.poke()
	}
}

// outage tells the watchers that the session, lost for the n-th time,
// has been down for the session timeout, unless it came back meanwhile.
func (r *Registry) outage(n int) {
	r.sess.mu.Lock()
	if r.sess.closed || r.sess.live || r.sess.downs != n {
		r.sess.mu.Unlock()
		return
	}
	r.sess.down = true
	ws := make([]*watcher, 0, len(r.sess.watchers))
	for w := range r.sess.watchers {
		ws = append(ws, w)
	}
	r.sess.mu.Unlock()
	timeout := r.SessionTimeout()
	r.log.Warn("no session with ZooKeeper for the session timeout; watchers report an outage and keep their last sets",
		"servers", strings.Join(r.cfg.Servers, ","), "session_timeout", timeout, "watchers", len(ws))
	for _, w := range ws {
		w.outage(timeout)
	}
}

// readEvents drains the client's event channel, which drops events when
// full, and logs session changes. It ends when the client has shut down.
func (r *Registry) readEvents(conn *zk.Conn, events <-chan zk.Event) {
	defer r.wg.Done()
	var session int64
	live := false
	for ev := range events {
		if ev.Type != zk.EventSession {
			continue
		}
		switch ev.State {
		case zk.StateHasSession:
			id := conn.SessionID()
			if granted := r.SessionTimeout(); id != session && granted != r.cfg.SessionTimeout {
				r.log.Info("ZooKeeper granted a session timeout other than the one asked for; using it",
					"session", sessionHex(id), "session_timeout", granted, "asked", r.cfg.SessionTimeout)
			}
			switch {
			case session == 0:
				r.log.Debug("session established", "session", sessionHex(id), "server", ev.Server)
			case id != session:
				r.log.Info("new session; restoring registrations", "session", sessionHex(id), "previous", sessionHex(session), "server", ev.Server)
			case !live:
				r.log.Info("reconnected", "session", sessionHex(id), "server", ev.Server)
			}
			session, live = id, true
		case zk.StateExpired:
			r.log.Warn("session expired; registrations will be restored on a new session", "session", sessionHex(session))
			live = false
		case zk.StateDisconnected:
			if live {
				select {
				case <-r.done:
				default:
					r.log.Warn("disconnected from ZooKeeper", "session", sessionHex(session), "server", ev.Server)
				}
			}
			live = false
		}
	}
}

// sessionHex formats a session ID the way ZooKeeper's tools print it.
func sessionHex(id int64) string { return fmt.Sprintf("0x%x", id) }

// clientLogger routes the ZooKeeper client's messages to slog at debug
// level: its connection attempts repeat every second while a server is
// down; the registry logs what matters itself.
type clientLogger struct{ log *slog.Logger }

func (l clientLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("zookeeper client: " + fmt.Sprintf(format, args...))
	}
}
