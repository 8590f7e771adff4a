// Package zk is the ZooKeeper backend of [registry.Registry].
//
// A server publishes itself and a client follows a service:
//
//	r, err := zk.New(zk.Config{Servers: []string{"10.0.0.1:2181", "10.0.0.2:2181"}})
//	if err != nil { ... }
//	defer r.Close() // removes what r registered
//	err = r.Register(ctx, registry.Instance{Service: "inventory.Inventory", ID: "10.0.0.7:20880", Addr: "10.0.0.7:20880"})
//	w, err := r.Watch(ctx, "inventory.Inventory")
//	set, err := w.Next(ctx) // the full set, now and after each change
//
// or, by URL, after importing this package:
//
//	r, err := registry.Open(ctx, "zk://10.0.0.1:2181,10.0.0.2:2181/services?session_timeout=10s")
//
// The host lists the servers, the path is the prefix; the query may set
// session_timeout and request_timeout as Go durations (Config.SessionTimeout
// and RequestTimeout: 10 s and 3 s by default). Unknown or repeated
// parameters, and credentials in the URL, are errors.
//
// The layout: a persistent node per service, <prefix>/<service>, and under
// it one EPHEMERAL node per instance, <prefix>/<service>/<instance-id>,
// holding the [registry.Instance] as JSON. An instance therefore disappears
// when its owner's session ends, whether by Close, by a crash (after the
// session timeout) or by a partition longer than the session timeout. When
// a session expires, the owner gets a new one and re-creates its nodes on
// its own; a node left by an older session of the same instance ID is
// replaced. A node that someone else deletes while the session lives is
// re-created at once: the owner watches each of its nodes. A node's data is
// never changed in place: a new version of an instance replaces the node in
// one transaction, so watchers, which watch the children of the service
// node, see every change.
//
// New does no I/O: the connection is made on first use. Every call waits
// for a live session at most until its context ends or
// [Config.RequestTimeout] passes, so a ZooKeeper that is down makes calls
// fail, never hang. A watcher keeps its last set while ZooKeeper is
// unreachable and resumes when the session is back. When the session has
// been down for the session timeout ZooKeeper granted
// ([Registry.SessionTimeout]; by then ZooKeeper has expired it, unless
// only this client was cut off, and the set may have changed unseen), Next
// returns an error wrapping [ErrNoSession], and so registry.ErrUnavailable,
// once; the call after that returns the full set as soon as a session is
// back and the set has been read again.
//
// A Registry implements [registry.Reachability]: a [registry.Cache] whose
// first lookup got no answer says whether ZooKeeper could not be reached.
package zk

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

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
	// SessionTimeout is the session timeout asked of ZooKeeper; default
	// 10 s. ZooKeeper grants one within its minSessionTimeout and
	// maxSessionTimeout (by default 2 and 20 ticks), which
	// [Registry.SessionTimeout] returns once a session is established:
	// an instance whose owner dies disappears after the one granted, and
	// a watcher reports an outage once the session has been down for it.
	// Divided by the number of servers, the timeout (asked for, then
	// granted) also bounds each connection handshake, so a server that
	// accepts connections but does not answer delays the move to the next
	// one by that much at most.
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
	cfg        Config
	log        *slog.Logger
	acl        []zk.ACL
	dialer     *dialer
	done       chan struct{} // closed by Close
	kick       chan struct{} // cap 1: wakes the keeper
	repairKick chan struct{} // cap 1: wakes the guard
	writes     chan struct{} // cap 1: a slot held while writing our nodes

	mu       sync.Mutex // guards following
	closed   bool
	conn     *zk.Conn
	dialing  *dial
	stateCh  chan struct{}                // closed and replaced on each session state change
	owned    map[string]registry.Instance // node path → instance; the keeper maintains these
	orphans  map[string]bool              // node paths to delete once possible
	armed    map[string]int64             // node path → session its exists watch was set in
	sessions map[int64]bool               // the sessions we wrote nodes in: an owner that is not one is another process
	repairs  map[string]int               // node paths for the guard → failed attempts
	watchers map[*watcher]struct{}
	live     bool        // the client has a session (as of its last session event)
	down     bool        // the session has been down for the session timeout: watchers reported it
	downAt   *time.Timer // reports the outage to the watchers once the session has been down for the session timeout
	downs    int         // counts session losses; downAt reports only the latest

	// Goroutines: the session event reader, the keeper, the guard, watchers and
	// requests outliving their caller's context. Close waits for them.
	wg sync.WaitGroup

	// armHook, when set (by tests), is called by the guard's repair
	// between putting a node right and watching it.
	armHook func(p string)
	// sessionHook, when set (by tests), is called by the keeper after it
	// has brought every owned node onto a session.
	sessionHook func(sessionID int64)
}

// dial is one attempt to create the client connection.
type dial struct {
	done chan struct{}
	conn *zk.Conn
	err  error
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
		cfg:        cfg,
		log:        log.With("registry", "zk"),
		acl:        zk.WorldACL(zk.PermAll),
		dialer:     newDialer(cfg.SessionTimeout, len(cfg.Servers)),
		done:       make(chan struct{}),
		kick:       make(chan struct{}, 1),
		repairKick: make(chan struct{}, 1),
		writes:     make(chan struct{}, 1),
		stateCh:    make(chan struct{}),
		owned:      make(map[string]registry.Instance),
		orphans:    make(map[string]bool),
		armed:      make(map[string]int64),
		sessions:   make(map[int64]bool),
		repairs:    make(map[string]int),
		watchers:   make(map[*watcher]struct{}),
	}, nil
}

// Config returns the configuration in use, defaults filled in.
func (r *Registry) Config() Config { return r.cfg }

// SessionTimeout returns the session timeout ZooKeeper granted for the
// current session (or the latest one), which may differ from the one
// Config.SessionTimeout asked for; before the first session, the one asked
// for. ZooKeeper expires a session it has not heard from for that long,
// and the registry times its outage reports by it.
func (r *Registry) SessionTimeout() time.Duration {
	if t := r.dialer.sessionTimeout(); t > 0 {
		return t
	}
	return r.cfg.SessionTimeout
}

// Unreachable implements registry.Reachability: it returns an error
// wrapping ErrNoSession, and so registry.ErrUnavailable, naming the
// servers and why, when the client has no connection to ZooKeeper and
// its latest one broke (the server closed it or went silent) or its
// latest attempt to connect failed; nil when it is connected (with or
// without a session yet), has not tried yet, or is closed.
func (r *Registry) Unreachable() error {
	r.mu.Lock()
	conn, closed := r.conn, r.closed
	r.mu.Unlock()
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
	data, err := json.Marshal(in)
	if err != nil {
		return fmt.Errorf("zk: register %s/%s: %w", in.Service, in.ID, err)
	}
	p := r.NodePath(in.Service, in.ID)
	err = r.write(ctx, func(conn *zk.Conn) error {
		if err := r.ensure(conn, p, data, true); err != nil {
			return err
		}
		r.mu.Lock()
		r.owned[p] = in
		delete(r.orphans, p)
		r.mu.Unlock()
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
	if err != nil {
		return fmt.Errorf("zk: register %s/%s: %w", in.Service, in.ID, err)
	}
	return nil
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
	p := r.NodePath(in.Service, in.ID)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("zk: deregister %s/%s: %w", in.Service, in.ID, registry.ErrClosed)
	}
	delete(r.owned, p)
	r.orphans[p] = true // until it is known to be gone
	r.mu.Unlock()
	err := r.write(ctx, func(conn *zk.Conn) error {
		// Again, in the write slot: a Register that held it may have
		// claimed the path meanwhile; the later call wins. A path is
		// never both owned and an orphan.
		r.mu.Lock()
		delete(r.owned, p)
		r.orphans[p] = true
		r.mu.Unlock()
		if err := r.removeIfOurs(conn, p); err != nil {
			return err
		}
		r.mu.Lock()
		delete(r.orphans, p)
		r.mu.Unlock()
		return nil
	})
	if err != nil {
		r.poke() // the keeper removes the orphan once it can
		return fmt.Errorf("zk: deregister %s/%s: %w", in.Service, in.ID, err)
	}
	return nil
}

// Close stops every watcher, deletes the nodes this Registry created
// (bounded by RequestTimeout; ending the session removes them anyway) and
// closes the connection. Later calls return registry.ErrClosed.
func (r *Registry) Close() error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return registry.ErrClosed
	}
	r.closed = true
	close(r.done)
	if r.downAt != nil {
		r.downAt.Stop()
	}
	conn, dialing := r.conn, r.dialing
	watchers := make([]*watcher, 0, len(r.watchers))
	for w := range r.watchers {
		watchers = append(watchers, w)
	}
	r.mu.Unlock()

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

// removeAll deletes the nodes we own, bounded by RequestTimeout.
func (r *Registry) removeAll(conn *zk.Conn) {
	if conn.State() != zk.StateHasSession {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.RequestTimeout)
	defer cancel()
	select {
	case r.writes <- struct{}{}:
	case <-ctx.Done():
		r.log.Warn("close: a write is still in progress; leaving node removal to the session's end")
		return
	}
	r.mu.Lock()
	paths := make([]string, 0, len(r.owned)+len(r.orphans))
	for p := range r.owned {
		paths = append(paths, p)
	}
	for p := range r.orphans {
		paths = append(paths, p)
	}
	r.mu.Unlock()
	// The requests run on their own so that ctx bounds them; wg covers
	// them (Close waits after conn.Close, which ends them).
	res := make(chan error, 1)
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		defer func() { <-r.writes }()
		var errs []error
		for _, p := range paths {
			errs = append(errs, r.removeIfOurs(conn, p))
		}
		res <- errors.Join(errs...)
	}()
	select {
	case err := <-res:
		if err != nil {
			r.log.Warn("close: removing nodes", "err", err)
		}
	case <-ctx.Done():
		r.log.Warn("close: removing nodes took longer than the request timeout; the session's end removes them")
	}
}

// bound limits ctx by RequestTimeout.
func (r *Registry) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.RequestTimeout)
}

// write runs fn with a live session, holding the write slot, bounded by
// ctx and RequestTimeout. fn runs on its own goroutine and keeps the slot
// until it returns, even when ctx ends first, so writes never overlap.
func (r *Registry) write(ctx context.Context, fn func(conn *zk.Conn) error) error {
	ctx, cancel := r.bound(ctx)
	defer cancel()
	conn, err := r.session(ctx)
	if err != nil {
		return err
	}
	select {
	case r.writes <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for another write: %w", ctx.Err())
	case <-r.done:
		return registry.ErrClosed
	}
	res := make(chan error, 1)
	if !r.spawn(func() {
		defer func() { <-r.writes }()
		res <- fn(conn)
	}) {
		<-r.writes
		return registry.ErrClosed
	}
	select {
	case err := <-res:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// spawn runs f on a goroutine Close waits for, unless r is closed.
func (r *Registry) spawn(f func()) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		f()
	}()
	return true
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
		r.mu.Lock()
		ch, closed := r.stateCh, r.closed
		r.mu.Unlock()
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
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, registry.ErrClosed
	}
	if r.conn != nil {
		conn := r.conn
		r.mu.Unlock()
		return conn, nil
	}
	d := r.dialing
	if d == nil {
		d = &dial{done: make(chan struct{})}
		r.dialing = d
		r.wg.Add(1)
		go r.dial(d)
	}
	r.mu.Unlock()
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
	r.mu.Lock()
	if err != nil {
		d.err = fmt.Errorf("zk: connect to %s: %w", strings.Join(r.cfg.Servers, ","), err)
		r.dialing = nil // the next call tries again
		r.mu.Unlock()
		return
	}
	if r.closed {
		r.mu.Unlock()
		d.err = registry.ErrClosed
		// Not under r.mu: the client calls onEvent while it shuts down.
		conn.Close()
		r.dialer.closeAll()
		for range events {
		}
		return
	}
	r.conn, d.conn = conn, conn
	r.wg.Add(3)
	go r.readEvents(conn, events)
	go r.keep(conn)
	go r.guard(conn)
	r.mu.Unlock()
}

// onEvent is called by the client, in order, for every event, before it
// tries to queue it on the (small, lossy) event channel. It must not
// block.
func (r *Registry) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		r.onNodeEvent(ev)
		return
	}
	r.mu.Lock()
	close(r.stateCh)
	r.stateCh = make(chan struct{})
	switch {
	case ev.State == zk.StateHasSession:
		r.live, r.down = true, false
		if r.downAt != nil {
			r.downAt.Stop()
			r.downAt = nil
		}
	case r.live && !r.closed:
		r.live = false
		r.downs++
		n := r.downs
		// ZooKeeper expires the session after the timeout it granted,
		// not the one asked for.
		r.downAt = time.AfterFunc(r.SessionTimeout(), func() { r.outage(n) })
	}
	r.mu.Unlock()
	if ev.State == zk.StateHasSession {
		r.poke()
	}
}

// outage tells the watchers that the session, lost for the n-th time,
// has been down for the session timeout, unless it came back meanwhile.
func (r *Registry) outage(n int) {
	r.mu.Lock()
	if r.closed || r.live || r.downs != n {
		r.mu.Unlock()
		return
	}
	r.down = true
	ws := make([]*watcher, 0, len(r.watchers))
	for w := range r.watchers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	timeout := r.SessionTimeout()
	r.log.Warn("no session with ZooKeeper for the session timeout; watchers report an outage and keep their last sets",
		"servers", strings.Join(r.cfg.Servers, ","), "session_timeout", timeout, "watchers", len(ws))
	for _, w := range ws {
		w.outage(timeout)
	}
}

// poke wakes the keeper.
func (r *Registry) poke() {
	select {
	case r.kick <- struct{}{}:
	default:
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

// keep brings the nodes we own onto the current session whenever a
// session is (re-)established, and removes orphans, retrying with backoff
// while that fails.
func (r *Registry) keep(conn *zk.Conn) {
	defer r.wg.Done()
	const minBackoff, maxBackoff = 100 * time.Millisecond, 5 * time.Second
	backoff := minBackoff
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-r.done:
			return
		case <-r.kick:
		case <-retry.C:
		}
		if conn.State() != zk.StateHasSession {
			continue // the next session pokes us
		}
		id, err := r.reconcile(conn)
		select {
		case <-r.done:
			return // errors here come from the connection closing
		default:
		}
		if err != nil {
			r.log.Warn("restoring registrations failed; retrying", "err", err, "in", backoff)
			retry.Reset(backoff)
			backoff = min(2*backoff, maxBackoff)
			continue
		}
		backoff = minBackoff
		if r.sessionHook != nil {
			r.sessionHook(id)
		}
	}
}

// reconcile makes ZooKeeper hold exactly our nodes, owned by the current
// session and watched, and returns that session's ID.
func (r *Registry) reconcile(conn *zk.Conn) (int64, error) {
	select {
	case r.writes <- struct{}{}:
	case <-r.done:
		return 0, registry.ErrClosed
	}
	defer func() { <-r.writes }()
	r.mu.Lock()
	owned := make(map[string]registry.Instance, len(r.owned))
	for p, in := range r.owned {
		owned[p] = in
	}
	orphans := make([]string, 0, len(r.orphans))
	for p := range r.orphans {
		orphans = append(orphans, p)
	}
	id := conn.SessionID()
	for p, on := range r.armed {
		if on != id {
			delete(r.armed, p) // set in an earlier session, which took it along
		}
	}
	r.mu.Unlock()

	var errs []error
	for p, in := range owned {
		data, err := json.Marshal(in)
		if err == nil {
			err = r.ensure(conn, p, data, false)
		}
		var intact bool
		if err == nil {
			intact, err = r.arm(conn, p, data)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		if !intact {
			r.queueRepair(p) // deleted or changed again already
		}
	}
	for _, p := range orphans {
		if err := r.removeIfOurs(conn, p); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", p, err))
			continue
		}
		r.mu.Lock()
		delete(r.orphans, p)
		r.mu.Unlock()
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if conn.SessionID() != id {
		return 0, errors.New("session changed while restoring registrations")
	}
	return id, nil
}

// maxAttempts bounds the retries of an operation that lost a race with
// another client.
const maxAttempts = 5

// ensure makes p an ephemeral node of the current session holding data.
// A node of another session or with other data is replaced in one
// transaction, so watchers never see the instance missing. Without
// takeOver (the keeper's restore after a reconnect or a new session) only
// a node of an earlier session of ours is replaced: one that another
// process took over since is left to it, as the guard does, or two
// processes under one instance ID would take it from each other at every
// reconnect. Register takes over: a restarted process replaces the node
// its predecessor's session still holds.
func (r *Registry) ensure(conn *zk.Conn, p string, data []byte, takeOver bool) error {
	r.mu.Lock()
	r.sessions[conn.SessionID()] = true
	r.mu.Unlock()
	for range maxAttempts {
		got, stat, err := conn.Get(p)
		if errors.Is(err, zk.ErrNoNode) {
			_, err = conn.Create(p, data, zk.FlagEphemeral, r.acl)
			switch {
			case err == nil:
				return nil
			case errors.Is(err, zk.ErrNoNode):
				if err := r.createParents(conn, path.Dir(p)); err != nil {
					return err
				}
				continue
			case errors.Is(err, zk.ErrNodeExists):
				continue
			}
			return err
		}
		if err != nil {
			return err
		}
		session := conn.SessionID()
		if stat.EphemeralOwner == session && bytes.Equal(got, data) {
			return nil
		}
		if stat.EphemeralOwner != session {
			r.mu.Lock()
			mine := r.sessions[stat.EphemeralOwner]
			r.mu.Unlock()
			if !takeOver && !mine && stat.EphemeralOwner != 0 {
				r.log.Warn("instance node is held by another session; not taking it back", "path", p,
					"owner", sessionHex(stat.EphemeralOwner), "session", sessionHex(session))
				return nil
			}
			r.log.Info("replacing a node of another session", "path", p, "owner", sessionHex(stat.EphemeralOwner), "session", sessionHex(session))
		}
		err = multi(conn,
			&zk.DeleteRequest{Path: p, Version: stat.Version},
			&zk.CreateRequest{Path: p, Data: data, Acl: r.acl, Flags: zk.FlagEphemeral})
		switch {
		case err == nil:
			return nil
		case errors.Is(err, zk.ErrNoNode), errors.Is(err, zk.ErrBadVersion), errors.Is(err, zk.ErrNodeExists):
			continue // someone else changed it in between: look again
		}
		return err
	}
	return fmt.Errorf("%s changed %d times while being written", p, maxAttempts)
}

// removeIfOurs deletes p if the current session owns it.
func (r *Registry) removeIfOurs(conn *zk.Conn, p string) error {
	for range maxAttempts {
		ok, stat, err := conn.Exists(p)
		if err != nil {
			return err
		}
		if !ok {
			return nil
		}
		if stat.EphemeralOwner != conn.SessionID() {
			r.log.Debug("not removing a node of another session", "path", p, "owner", sessionHex(stat.EphemeralOwner))
			return nil
		}
		err = conn.Delete(p, stat.Version)
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			return nil
		}
		if !errors.Is(err, zk.ErrBadVersion) {
			return err
		}
	}
	return fmt.Errorf("%s changed %d times while being removed", p, maxAttempts)
}

// createParents creates p and its missing ancestors as persistent nodes.
func (r *Registry) createParents(conn *zk.Conn, p string) error {
	var cur string
	for part := range strings.SplitSeq(strings.TrimPrefix(p, "/"), "/") {
		cur += "/" + part
		_, err := conn.Create(cur, nil, zk.FlagPersistent, r.acl)
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", cur, err)
		}
	}
	return nil
}

// multi runs ops in one transaction and returns the first operation's
// error when it fails.
func multi(conn *zk.Conn, ops ...any) error {
	res, err := conn.Multi(ops...)
	for _, r := range res {
		if r.Error != nil {
			return r.Error
		}
	}
	return err
}

// validInstance checks an instance for registry-wide rules and for the
// characters ZooKeeper refuses in node names.
func validInstance(in registry.Instance) error {
	if err := in.Validate(); err != nil {
		return err
	}
	if err := validService(in.Service); err != nil {
		return err
	}
	return validID(in)
}

func validID(in registry.Instance) error {
	var why string
	switch id := in.ID; {
	case id == "":
		why = "empty"
	case id == "." || id == "..":
		why = "reserved"
	case strings.ContainsRune(id, '/'):
		why = "contains '/'"
	case strings.IndexFunc(id, func(c rune) bool { return c < 0x20 }) >= 0:
		why = "contains a control character"
	default:
		if err := checkName(id); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		return fmt.Errorf("%w instance id %q of %s: %s", registry.ErrInvalid, in.ID, in.Service, why)
	}
	return nil
}

func validService(service string) error {
	if err := registry.ValidateService(service); err != nil {
		return err
	}
	if err := checkName(service); err != nil {
		return fmt.Errorf("%w service name %q: %v", registry.ErrInvalid, service, err)
	}
	return nil
}

// checkName reports characters ZooKeeper does not allow in a node name
// beyond those registry.ValidateService rejects.
func checkName(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, c := range s {
		switch {
		case c == 0x7f || c >= 0x80 && c <= 0x9f,
			c >= 0xd800 && c <= 0xf8ff,
			c >= 0xfff0:
			// ZooKeeper checks the name's UTF-16 units: a character
			// beyond U+FFFF is a surrogate pair, in the refused range.
			return fmt.Errorf("character %U is not allowed in a ZooKeeper node name", c)
		}
	}
	return nil
}

// checkPath checks a cleaned absolute path, such as the prefix.
func checkPath(p string) error {
	for part := range strings.SplitSeq(strings.TrimPrefix(p, "/"), "/") {
		if err := checkName(part); err != nil {
			return err
		}
		if part == "" || strings.IndexFunc(part, func(c rune) bool { return c < 0x20 }) >= 0 {
			return errors.New("empty component or control character")
		}
	}
	if p == "/zookeeper" || strings.HasPrefix(p, "/zookeeper/") {
		return errors.New("/zookeeper is reserved by ZooKeeper")
	}
	return nil
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
