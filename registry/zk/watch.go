// Watching a service: the set of its instances, now and after each change.

package zk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
	"golang.org/x/sync/errgroup"
)

// Watch starts following the instances of service. It reads the current
// set, so that the first Next returns at once. It then reads the set again
// after every change of the service node's children. ctx bounds only this
// call, as RequestTimeout does; the watch lasts until Stop or Close.
func (r *Registry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	if err := validService(service); err != nil {
		return nil, fmt.Errorf("zk: watch: %w", err)
	}
	ctx, cancel := r.bound(ctx)
	defer cancel()
	conn, err := r.session(ctx)
	if err != nil {
		return nil, fmt.Errorf("zk: watch %s: %w", service, err)
	}
	wctx, wcancel := context.WithCancel(context.Background())
	w := &watcher{
		r:       r,
		service: service,
		path:    r.servicePath(service),
		ctx:     wctx,
		cancel:  wcancel,
		changed: make(chan struct{}),
		kick:    make(chan struct{}, 1),
		synced:  true,
		fresh:   true,
	}
	type result struct {
		list   []registry.Instance
		events <-chan zk.Event
		err    error
	}
	res := make(chan result, 1)
	if !r.spawn(func() {
		list, events, err := w.load(conn)
		res <- result{list, events, err}
	}) {
		wcancel()
		return nil, fmt.Errorf("zk: watch %s: %w", service, registry.ErrClosed)
	}
	var first result
	select {
	case first = <-res:
	case <-ctx.Done():
		first.err = ctx.Err()
	}
	if first.err != nil {
		wcancel()
		return nil, fmt.Errorf("zk: watch %s: %w", service, first.err)
	}
	w.cur = first.list

	r.sess.mu.Lock()
	defer r.sess.mu.Unlock()
	if r.sess.closed {
		wcancel()
		return nil, fmt.Errorf("zk: watch %s: %w", service, registry.ErrClosed)
	}
	r.sess.watchers[w] = struct{}{}
	if r.sess.down {
		// The session was lost after the read, and has been down for
		// long enough already.
		w.outage(r.SessionTimeout())
	}
	r.wg.Add(1)
	go w.run(conn, first.events)
	return w, nil
}

// watcher is a registry.Watcher of one service.
type watcher struct {
	r       *Registry
	service string
	path    string
	ctx     context.Context // ends with Stop
	cancel  context.CancelFunc

	kick chan struct{} // cap 1: wakes run to read the set again after an outage

	mu      sync.Mutex // guards following
	cur     []registry.Instance
	synced  bool          // cur was read since the last outage
	down    error         // the outage not yet reported by Next
	outages int           // counts outages, so that a read that began before one is not taken for after
	changed chan struct{} // closed and replaced when the fields above change
	last    []registry.Instance
	fresh   bool // Next returns the set even if it is unchanged: at first, and after an outage

	read readState // what load read last; load's alone
}

// Next returns the current set the first time, then blocks until the set
// differs from the one it last returned. When the session has been down
// for the session timeout ZooKeeper granted it returns an error wrapping
// ErrNoSession once; the next call returns the full set once the session
// is back and the set has been read again.
func (w *watcher) Next(ctx context.Context) ([]registry.Instance, error) {
	for {
		if w.ctx.Err() != nil {
			return nil, registry.ErrWatcherStopped
		}
		w.mu.Lock()
		if err := w.down; err != nil {
			w.down, w.fresh = nil, true
			w.mu.Unlock()
			return nil, err
		}
		if w.synced && (w.fresh || !registry.EqualSets(w.cur, w.last)) {
			w.last, w.fresh = w.cur, false
			out := registry.CloneSet(w.cur)
			w.mu.Unlock()
			return out, nil
		}
		changed := w.changed
		w.mu.Unlock()
		select {
		case <-changed:
		case <-w.ctx.Done():
			return nil, registry.ErrWatcherStopped
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Stop ends the watch; Next returns registry.ErrWatcherStopped.
func (w *watcher) Stop() {
	w.cancel()
	w.r.sess.mu.Lock()
	delete(w.r.sess.watchers, w)
	w.r.sess.mu.Unlock()
}

// outage marks the set as out of date, for Next to report, and makes run
// read it again once the session is back. The session has been down for
// timeout, the session timeout.
func (w *watcher) outage(timeout time.Duration) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return // reported already
	}
	w.synced = false
	w.outages++
	w.down = fmt.Errorf("zk: watching %s: %w for %v (session timeout)", w.service, ErrNoSession, timeout)
	close(w.changed)
	w.changed = make(chan struct{})
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run re-arms the child watch after each event and publishes the set read
// while re-arming, so a change between the event and the re-arm is not
// lost. While ZooKeeper is unreachable it keeps the last set: the client
// restores its watches on reconnection, and a session expiry ends them with
// an event, after which run waits for the new session and reloads. After
// an outage (see outage) it reads the set again as soon as the session is
// back, changed or not, for Next to return.
func (w *watcher) run(conn *zk.Conn, events <-chan zk.Event) {
	defer w.r.wg.Done()
	const minDelay, maxDelay = 100 * time.Millisecond, 2 * time.Second
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case ev := <-events:
			if ev.Type == zk.EventNotWatching {
				w.r.log.Debug("watch ended by the client; reloading", "path", w.path, "err", ev.Err)
			}
		case <-w.kick:
			w.r.log.Debug("watch: outage; reloading once the session is back", "path", w.path)
		case <-w.ctx.Done():
			return
		}
		for delay := minDelay; ; delay = min(2*delay, maxDelay) {
			if err := w.r.waitSession(w.ctx, conn); err != nil {
				return // stopped or closed
			}
			outages := w.outageCount()
			list, next, err := w.load(conn)
			if w.ctx.Err() != nil {
				return
			}
			if err == nil && w.publish(list, outages) {
				events = next
				break
			}
			if err == nil {
				// An outage was reported while reading: the list may
				// be older than it. Read again on the next session.
				events = next
				continue
			}
			w.r.log.Debug("watch: reload failed; keeping the last set", "path", w.path, "err", err, "retry_in", delay)
			retry.Reset(delay)
			select {
			case <-retry.C:
			case <-w.ctx.Done():
				return
			}
		}
	}
}

// load sets a watch on the service node's children (or on the node's
// creation while it does not exist) and reads the instances. It reads the
// data of the children it has not read before; the others keep what the
// last load read, unless the service node's child version shows that a
// child was deleted and created again since (a Register replacing an
// instance's data does that): then it reads every child again. The list
// of children names comes whole from ZooKeeper at every change. load
// never runs twice at once: it alone uses w.read.
func (w *watcher) load(conn *zk.Conn) ([]registry.Instance, <-chan zk.Event, error) {
	for range maxAttempts {
		children, stat, events, err := conn.ChildrenW(w.path)
		if errors.Is(err, zk.ErrNoNode) {
			w.read = readState{}
			exists, _, created, err := conn.ExistsW(w.path)
			if err != nil {
				return nil, nil, err
			}
			if exists {
				continue // created in between; watch its children
			}
			return nil, created, nil
		}
		if err != nil {
			return nil, nil, err
		}
		var prev map[string]childNode
		if w.read.nodes != nil && stat.Czxid == w.read.czxid {
			prev = w.read.nodes // the same service node as last time
		}
		nodes := make(map[string]childNode, len(children))
		var fetch []string
		for _, child := range children {
			if n, ok := prev[child]; ok {
				nodes[child] = n
			} else {
				fetch = append(fetch, child)
			}
		}
		// Each creation and deletion of a child adds one to Cversion.
		// More than the names that came and went means that a name
		// kept was deleted and created again: its data may differ.
		removed := len(prev) - (len(children) - len(fetch))
		if prev != nil && int64(stat.Cversion)-int64(w.read.cversion) != int64(len(fetch)+removed) {
			clear(nodes)
			fetch = children
		}
		if err := w.fetch(conn, fetch, nodes); err != nil {
			w.read = readState{}
			return nil, nil, err
		}
		w.read = readState{czxid: stat.Czxid, cversion: stat.Cversion, nodes: nodes}
		list := make([]registry.Instance, 0, len(children))
		for _, child := range children {
			if n, ok := nodes[child]; ok && n.ok {
				list = append(list, n.in)
			}
		}
		return registry.SortedCopy(list), events, nil
	}
	return nil, nil, fmt.Errorf("%s appeared and vanished %d times", w.path, maxAttempts)
}

// readState is what the last load read: the service node's creation
// zxid and child version, and each child's decoded data.
type readState struct {
	czxid    int64
	cversion int32
	nodes    map[string]childNode // nil: read every child
}

// childNode is a child's data as decoded; ok is false for a node that
// holds no instance (skipped, and logged once).
type childNode struct {
	in registry.Instance
	ok bool
}

// fetchHook, set only by tests, is called by each load of a watcher of r
// with the number of children whose data it reads.
var fetchHook func(r *Registry, n int)

// fetchParallel bounds the Gets load has in flight at once: the client
// pipelines them on the session's connection.
const fetchParallel = 32

// fetch reads and decodes the children named into nodes, up to
// fetchParallel at once. A child gone since the list is left out: its
// deletion has fired the child watch. After a failure the reads not
// started are skipped.
func (w *watcher) fetch(conn *zk.Conn, names []string, nodes map[string]childNode) error {
	if fetchHook != nil {
		fetchHook(w.r, len(names))
	}
	got := make([]childNode, len(names))
	gone := make([]bool, len(names))
	g, failed := errgroup.WithContext(context.Background())
	g.SetLimit(fetchParallel)
	for i, name := range names {
		g.Go(func() error {
			if failed.Err() != nil {
				return nil
			}
			data, _, err := conn.Get(w.path + "/" + name)
			if errors.Is(err, zk.ErrNoNode) {
				gone[i] = true
				return nil
			}
			if err != nil {
				return err
			}
			got[i].in, got[i].ok = w.decode(name, data)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return err
	}
	for i, name := range names {
		if !gone[i] {
			nodes[name] = got[i]
		}
	}
	return nil
}

// decode reads an instance node. The path names the instance: the
// service and ID in the data must agree with it, or are filled from it.
func (w *watcher) decode(child string, data []byte) (registry.Instance, bool) {
	var in registry.Instance
	if err := json.Unmarshal(data, &in); err != nil {
		w.r.log.Warn("skipping a node that does not hold an instance", "path", w.path+"/"+child, "err", err)
		return in, false
	}
	if (in.Service != "" && in.Service != w.service) || (in.ID != "" && in.ID != child) {
		w.r.log.Warn("node data names another instance; using the node's path",
			"path", w.path+"/"+child, "service", in.Service, "id", in.ID)
	}
	in.Service, in.ID = w.service, child
	if in.Addr == "" {
		w.r.log.Warn("skipping an instance without an address", "path", w.path+"/"+child)
		return in, false
	}
	return in, true
}

func (w *watcher) outageCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.outages
}

// publish makes list, read after the outages-th outage, the current set
// if it differs from it or the set was out of date. It returns false when
// an outage was reported since: list may be older than it.
func (w *watcher) publish(list []registry.Instance, outages int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.outages != outages {
		return false
	}
	if w.synced && registry.EqualSets(w.cur, list) {
		return true
	}
	w.cur, w.synced = list, true
	w.r.log.Debug("watch: set read", "path", w.path, "instances", len(list))
	close(w.changed)
	w.changed = make(chan struct{})
	return true
}
