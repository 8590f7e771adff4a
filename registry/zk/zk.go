// The Registry type: Config, New, Register, Deregister and Close.

package zk

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
)

// Defaults of Config.
const (
	DefaultSessionTimeout = 10 * time.Second
	DefaultRequestTimeout = 3 * time.Second
)

// ErrNoSession is wrapped, together with the context's error, by calls that
// gave up waiting for a session with ZooKeeper: the servers are down,
// unreachable or refusing the session. errors.Is(err,
// registry.ErrUnavailable) holds for it too.
var ErrNoSession error = noSessionError{}

type noSessionError struct{}

func (noSessionError) Error() string { return "zk: no session with ZooKeeper" }

// Is makes errors.Is(err, registry.ErrUnavailable) hold too.
func (noSessionError) Is(target error) bool { return target == registry.ErrUnavailable }

// Config configures a Registry. The zero value of every field but Servers
// has a working default.
type Config struct {
	// Servers lists the ZooKeeper servers as host:port (host alone means
	// port 2181).
	Servers []string
	// Prefix is the root under which services live; default
	// registry.DefaultPrefix, "/services".
	Prefix string
	// SessionTimeout is the session timeout asked of ZooKeeper. Default
	// 10 s. ZooKeeper grants one within its minSessionTimeout and
	// maxSessionTimeout, 2 and 20 ticks by default; see
	// [Registry.SessionTimeout]. An instance whose owner dies disappears
	// after the one granted, and watchers report an outage after it. The
	// timeout divided by the number of servers bounds each handshake.
	SessionTimeout time.Duration
	// RequestTimeout bounds each call (Register, Deregister, Watch) when
	// its context has no earlier deadline, the wait for a session
	// included; default 3 s.
	RequestTimeout time.Duration
	// Logger receives the registry's events (session lost and regained,
	// re-registration) and, at debug level, the ZooKeeper client's own
	// messages; nil means slog.Default().
	Logger *slog.Logger
}

// Registry is a registry.Registry kept in ZooKeeper. Its methods are safe
// for concurrent use.
type Registry struct {
	cfg    Config
	log    *slog.Logger
	acl    []zk.ACL
	dialer *dialer
	done   chan struct{} // closed by Close
	writes chan struct{} // cap 1: a slot held while writing our nodes

	sess    sessionState // session.go: the connection and its session
	kept    keptState    // keeper.go: the nodes we own
	guarded guardState   // guard.go: the watches on them

	// Goroutines: the session event reader, the keeper, the guard, watchers and
	// requests outliving their caller's context. Close waits for them.
	wg sync.WaitGroup
}

var (
	_ registry.Registry     = (*Registry)(nil)
	_ registry.Reachability = (*Registry)(nil)
)

// New returns a Registry for cfg. It does no I/O: the connection to
// ZooKeeper is made on first use.
func New(cfg Config) (*Registry, error) {
	if len(cfg.Servers) == 0 {
		return nil, fmt.Errorf("zk: new: no servers: %w", registry.ErrInvalid)
	}
	servers := make([]string, 0, len(cfg.Servers))
	for _, s := range cfg.Servers {
		s = strings.TrimSpace(s)
		if s == "" {
			return nil, fmt.Errorf("zk: new: empty server address in %q: %w", cfg.Servers, registry.ErrInvalid)
		}
		servers = append(servers, s)
	}
	cfg.Servers = servers
	cfg.Prefix = registry.CleanPrefix(cfg.Prefix)
	if err := checkPath(cfg.Prefix); err != nil {
		return nil, fmt.Errorf("zk: new: prefix %q: %w: %w", cfg.Prefix, err, registry.ErrInvalid)
	}
	switch {
	case cfg.SessionTimeout < 0:
		return nil, fmt.Errorf("zk: new: negative session timeout %v: %w", cfg.SessionTimeout, registry.ErrInvalid)
	case cfg.SessionTimeout == 0:
		cfg.SessionTimeout = DefaultSessionTimeout
	}
	switch {
	case cfg.RequestTimeout < 0:
		return nil, fmt.Errorf("zk: new: negative request timeout %v: %w", cfg.RequestTimeout, registry.ErrInvalid)
	case cfg.RequestTimeout == 0:
		cfg.RequestTimeout = DefaultRequestTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	cfg.Logger = log
	return &Registry{
		cfg:    cfg,
		log:    log.With("registry", "zk"),
		acl:    zk.WorldACL(zk.PermAll),
		dialer: newDialer(cfg.SessionTimeout, len(cfg.Servers)),
		done:   make(chan struct{}),
		writes: make(chan struct{}, 1),
		sess: sessionState{
			stateCh:  make(chan struct{}),
			watchers: make(map[*watcher]struct{}),
		},
		kept: keptState{
			kick:     make(chan struct{}, 1),
			owned:    make(map[string]registry.Instance),
			orphans:  make(map[string]bool),
			sessions: make(map[int64]bool),
		},
		guarded: guardState{
			kick:    make(chan struct{}, 1),
			armed:   make(map[string]int64),
			repairs: make(map[string]int),
		},
	}, nil
}

// Config returns the configuration in use, defaults filled in.
func (r *Registry) Config() Config { return r.cfg }

// NodePath returns the path of an instance's node: <prefix>/<service>/<id>.
func (r *Registry) NodePath(service, id string) string {
	return r.cfg.Prefix + "/" + service + "/" + id
}

func (r *Registry) servicePath(service string) string {
	return r.cfg.Prefix + "/" + service
}

// Register publishes the instance as an ephemeral node and keeps it there:
// after a session expiry the node is re-created on the new session, and
// when someone else deletes it while the session lives it is re-created at
// once. A second Register of the same instance ID replaces its data.
//
// When Register fails because its context ended, the request may still
// complete afterwards; the instance is then maintained as if Register had
// succeeded. Call Deregister to be sure it is gone.
func (r *Registry) Register(ctx context.Context, in registry.Instance) error {
	if err := validInstance(in); err != nil {
		return fmt.Errorf("zk: register: %w", err)
	}
	if err := r.keepNode(ctx, r.NodePath(in.Service, in.ID), in); err != nil {
		return fmt.Errorf("zk: register %s/%s: %w", in.Service, in.ID, err)
	}
	return nil
}

// RegisterAt publishes in as the ephemeral node at p, under a layout other
// than <prefix>/<service>/<id> (the dubbo module writes Dubbo's), and keeps
// it there as Register keeps its nodes. The node's data is in as JSON; in
// is checked as Register checks it. p is a clean absolute path at least
// two levels below the prefix; its parents are created persistent. All the
// nodes of a Registry, wherever they are, share its one session.
func (r *Registry) RegisterAt(ctx context.Context, p string, in registry.Instance) error {
	if err := validInstance(in); err != nil {
		return fmt.Errorf("zk: register at %s: %w", p, err)
	}
	if err := r.validNodePath(p); err != nil {
		return fmt.Errorf("zk: register at %s: %w", p, err)
	}
	if err := r.keepNode(ctx, p, in); err != nil {
		return fmt.Errorf("zk: register at %s: %w", p, err)
	}
	return nil
}

// validNodePath checks a path given to RegisterAt or DeregisterAt.
func (r *Registry) validNodePath(p string) error {
	rel, below := strings.CutPrefix(p, r.cfg.Prefix+"/")
	if r.cfg.Prefix == "/" {
		rel, below = strings.CutPrefix(p, "/")
	}
	switch {
	case path.Clean(p) != p || !below:
		return fmt.Errorf("%w: not a clean path below the prefix %s", registry.ErrInvalid, r.cfg.Prefix)
	case !strings.Contains(rel, "/"):
		return fmt.Errorf("%w: a node needs a parent below the prefix %s", registry.ErrInvalid, r.cfg.Prefix)
	}
	if err := checkPath(p); err != nil {
		return fmt.Errorf("%w: %w", registry.ErrInvalid, err)
	}
	return nil
}

// keepNode makes p in's ephemeral node and has the keeper maintain it.
func (r *Registry) keepNode(ctx context.Context, p string, in registry.Instance) error {
	data, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return r.write(ctx, func(conn *zk.Conn) error {
		if err := r.ensure(conn, p, data, true); err != nil {
			return err
		}
		r.kept.mu.Lock()
		r.kept.owned[p] = in
		delete(r.kept.orphans, p)
		r.kept.mu.Unlock()
		// The node is ours now; when it cannot be watched or is gone
		// already, the guard sees to it.
		if intact, err := r.arm(conn, p, data); err != nil {
			r.log.Warn("register: watching the node failed; retrying", "path", p, "err", err)
			r.queueRepair(p)
		} else if !intact {
			r.queueRepair(p)
		}
		return nil
	})
}

// Deregister removes the instance's node, if this Registry created it, and
// stops maintaining it at once. When ZooKeeper cannot be reached it returns
// an error and the node is removed later, as soon as the session is back
// (or with the session's end).
func (r *Registry) Deregister(ctx context.Context, in registry.Instance) error {
	if err := validService(in.Service); err != nil {
		return fmt.Errorf("zk: deregister: %w", err)
	}
	if err := validID(in); err != nil {
		return fmt.Errorf("zk: deregister: %w", err)
	}
	if err := r.dropNode(ctx, r.NodePath(in.Service, in.ID)); err != nil {
		return fmt.Errorf("zk: deregister %s/%s: %w", in.Service, in.ID, err)
	}
	return nil
}

// DeregisterAt removes the node RegisterAt published at p, as Deregister
// removes Register's.
func (r *Registry) DeregisterAt(ctx context.Context, p string) error {
	if err := r.validNodePath(p); err != nil {
		return fmt.Errorf("zk: deregister at %s: %w", p, err)
	}
	if err := r.dropNode(ctx, p); err != nil {
		return fmt.Errorf("zk: deregister at %s: %w", p, err)
	}
	return nil
}

// dropNode stops maintaining node p and removes it, if it is ours.
func (r *Registry) dropNode(ctx context.Context, p string) error {
	if r.isClosed() {
		return registry.ErrClosed
	}
	r.kept.mu.Lock()
	delete(r.kept.owned, p)
	r.kept.orphans[p] = true // until it is known to be gone
	r.kept.mu.Unlock()
	err := r.write(ctx, func(conn *zk.Conn) error {
		// Again, in the write slot: a Register that held it may have
		// claimed the path meanwhile; the later call wins. A path is
		// never both owned and an orphan.
		r.kept.mu.Lock()
		delete(r.kept.owned, p)
		r.kept.orphans[p] = true
		r.kept.mu.Unlock()
		if err := r.removeIfOurs(conn, p); err != nil {
			return err
		}
		r.kept.mu.Lock()
		delete(r.kept.orphans, p)
		r.kept.mu.Unlock()
		return nil
	})
	if err != nil {
		r.poke() // the keeper removes the orphan once it can
		return err
	}
	return nil
}

// Close stops every watcher, deletes the nodes this Registry created
// (bounded by RequestTimeout; ending the session removes them anyway) and
// closes the connection. Later calls return registry.ErrClosed.
func (r *Registry) Close() error {
	r.sess.mu.Lock()
	if r.sess.closed {
		r.sess.mu.Unlock()
		return registry.ErrClosed
	}
	r.sess.closed = true
	close(r.done)
	if r.sess.downAt != nil {
		r.sess.downAt.Stop()
	}
	conn, dialing := r.sess.conn, r.sess.dialing
	watchers := make([]*watcher, 0, len(r.sess.watchers))
	for w := range r.sess.watchers {
		watchers = append(watchers, w)
	}
	r.sess.mu.Unlock()

	for _, w := range watchers {
		w.Stop()
	}
	if conn == nil && dialing != nil {
		<-dialing.done // the dialer sees closed and closes what it made
	}
	if conn != nil {
		r.removeAll(conn)
		conn.Close() // ends the session, which removes our nodes
	}
	r.dialer.closeAll() // cuts a handshake still in progress
	r.wg.Wait()
	return nil
}

// bound limits ctx by RequestTimeout.
func (r *Registry) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.RequestTimeout)
}

// spawn runs f on a goroutine Close waits for, unless r is closed.
func (r *Registry) spawn(f func()) bool {
	r.sess.mu.Lock()
	defer r.sess.mu.Unlock()
	if r.sess.closed {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
	return true
}
