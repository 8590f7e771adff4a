// The reading session: one ZooKeeper connection per Registry, its outages and reachability.

package dubbo

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/zk"
	gozk "github.com/go-zookeeper/zk"
)

// reader is the session Watch reads through: one per Registry, made at
// the first Watch. Only the names of the provider nodes are read: Dubbo's
// URLs are the names, whatever the data.
type reader struct {
	r      *Registry
	conn   *gozk.Conn
	dialer *zk.Dialer    // bounds handshakes, reads the session timeout granted
	done   chan struct{} // closed by close
	wg     sync.WaitGroup

	mu       sync.Mutex    // guards following
	stateCh  chan struct{} // closed and replaced at each session event
	live     bool          // the client has a session
	downs    int           // counts session losses; downAt reports only the latest
	downAt   *time.Timer   // reports an outage once the session has been down for the session timeout
	down     bool          // the outage was reported
	watchers map[*watcher]struct{}
}

// sessionTimeout returns the session timeout ZooKeeper granted, or the one
// asked for before the first session: ZooKeeper expires a session after
// the timeout it granted.
func (rd *reader) sessionTimeout() time.Duration {
	if t := rd.dialer.SessionTimeout(); t > 0 {
		return t
	}
	return rd.r.cfg.SessionTimeout
}

var _ registry.Reachability = (*Registry)(nil)

// Unreachable implements registry.Reachability for the reading session:
// it returns an error wrapping registry.ErrUnavailable, naming the
// servers, when the client has no connection and its latest attempt to
// make one failed, or its latest connection broke. It returns nil when connected, before the first Watch,
// or when it cannot tell. It does no I/O.
func (r *Registry) Unreachable() error {
	r.mu.Lock()
	rd := r.reader
	r.mu.Unlock()
	if rd == nil || rd.isClosed() {
		return nil
	}
	switch rd.conn.State() {
	case gozk.StateDisconnected, gozk.StateConnecting:
		if err := rd.dialer.LastFailure(); err != nil {
			return fmt.Errorf("%w: ZooKeeper at %s unreachable: %w", registry.ErrUnavailable, strings.Join(r.cfg.Servers, ","), err)
		}
	}
	return nil
}

// readerFor returns r's reader, connecting on first use.
func (r *Registry) readerFor() (*reader, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, registry.ErrClosed
	}
	if r.reader != nil {
		return r.reader, nil
	}
	rd := &reader{r: r, dialer: zk.NewDialer(r.cfg.SessionTimeout, len(r.cfg.Servers)),
		done: make(chan struct{}), stateCh: make(chan struct{}), watchers: make(map[*watcher]struct{})}
	conn, events, err := gozk.Connect(r.cfg.Servers, r.cfg.SessionTimeout, gozk.WithDialer(rd.dialer.Dial),
		gozk.WithLogger(clientLogger{r.log}), gozk.WithLogInfo(false), gozk.WithEventCallback(rd.onEvent))
	if err != nil {
		return nil, fmt.Errorf("connect to %s: %w", strings.Join(r.cfg.Servers, ","), err)
	}
	rd.conn = conn
	rd.wg.Go(func() {
		for range events { // lossy and unused: session events come through onEvent
		}
	})
	r.reader = rd
	return rd, nil
}

// onEvent follows the session; the client calls it in order, and it must
// not block.
func (rd *reader) onEvent(ev gozk.Event) {
	if ev.Type != gozk.EventSession {
		return
	}
	rd.mu.Lock()
	defer rd.mu.Unlock()
	close(rd.stateCh)
	rd.stateCh = make(chan struct{})
	if rd.isClosed() {
		return // the session ends with close: no outage to report
	}
	switch {
	case ev.State == gozk.StateHasSession:
		rd.live, rd.down = true, false
		if rd.downAt != nil {
			rd.downAt.Stop()
			rd.downAt = nil
		}
	case rd.live:
		rd.live = false
		rd.downs++
		n := rd.downs
		rd.downAt = time.AfterFunc(rd.sessionTimeout(), func() { rd.outage(n) })
	}
}

// outage tells the watchers that the session, lost for the n-th time, has
// been down for the session timeout, unless it came back meanwhile.
func (rd *reader) outage(n int) {
	rd.mu.Lock()
	if rd.live || rd.downs != n || rd.isClosed() {
		rd.mu.Unlock()
		return
	}
	rd.down = true
	ws := make([]*watcher, 0, len(rd.watchers))
	for w := range rd.watchers {
		ws = append(ws, w)
	}
	rd.mu.Unlock()
	rd.r.log.Warn("no session with ZooKeeper for the session timeout; watchers report an outage and keep their last sets",
		"servers", strings.Join(rd.r.cfg.Servers, ","), "watchers", len(ws))
	for _, w := range ws {
		w.outage()
	}
}

func (rd *reader) isClosed() bool {
	select {
	case <-rd.done:
		return true
	default:
		return false
	}
}

// spawn runs f on a goroutine close waits for, unless close has begun.
func (rd *reader) spawn(f func()) bool {
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.isClosed() {
		return false
	}
	rd.wg.Go(f)
	return true
}

// waitSession waits until the client has a live session.
func (rd *reader) waitSession(ctx context.Context) error {
	for {
		rd.mu.Lock()
		ch := rd.stateCh
		rd.mu.Unlock()
		if rd.isClosed() {
			return registry.ErrClosed
		}
		st := rd.conn.State()
		if st == gozk.StateHasSession {
			return nil
		}
		select {
		case <-ch:
		case <-rd.done:
			return registry.ErrClosed
		case <-ctx.Done():
			return fmt.Errorf("%w: no session with %s (state %v): %w",
				registry.ErrUnavailable, strings.Join(rd.r.cfg.Servers, ","), st, ctx.Err())
		}
	}
}

// close stops the watchers and ends the session.
func (rd *reader) close() {
	rd.mu.Lock()
	close(rd.done)
	if rd.downAt != nil {
		rd.downAt.Stop()
	}
	ws := make([]*watcher, 0, len(rd.watchers))
	for w := range rd.watchers {
		ws = append(ws, w)
	}
	rd.mu.Unlock()
	for _, w := range ws {
		w.Stop()
	}
	rd.conn.Close()
	rd.dialer.CloseAll() // cuts a handshake still in progress
	rd.wg.Wait()
}

// clientLogger routes the ZooKeeper client's messages to slog at debug
// level: its connection attempts repeat every second while a server is
// down.
type clientLogger struct{ log *slog.Logger }

func (l clientLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		l.log.Debug("zookeeper client: " + fmt.Sprintf(format, args...))
	}
}
