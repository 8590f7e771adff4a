// Watching a service: the set of its instances, now and after each change.

package zk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
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
		list    []registry.Instance
		version uint64
		events  <-chan zk.Event
		err     error
	}
	res := make(chan result, 1)
	if !r.spawn(func() {
		list, version, events, err := w.load(conn)
		res <- result{list, version, events, err}
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
	w.cur, w.curVersion = first.list, first.version

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

	mu sync.Mutex // guards following
	// cur is the set load read last, sorted by ID; it is never changed,
	// only replaced. curVersion is its version (see version below).
	cur         []registry.Instance
	curVersion  uint64
	synced      bool          // cur was read since the last outage
	down        error         // the outage not yet reported by Next
	outages     int           // counts outages, so that a read that began before one is not taken for after
	changed     chan struct{} // closed and replaced when the fields above change
	last        []registry.Instance
	lastVersion uint64
	fresh       bool // Next returns the set even if it is unchanged: at first, and after an outage

	// load's alone: what it read last (read), the list it returned last
	// (list) and that list's version, which grows by one each time the
	// list differs from the one before.
	read    readState
	list    []registry.Instance
	version uint64
}

// Next returns the current set the first time, then blocks until the set
// differs from the one it last returned. When the session has been down
// for the session timeout ZooKeeper granted it returns an error wrapping
// ErrNoSession once; the next call returns the full set once the session
// is back and the set has been read again.
func (w *watcher) Next(ctx context.Context) ([]registry.Instance, error) {
	return registry.WaitNext(ctx, w.ctx.Done(), w.poll)
}

// poll returns what Next returns now, or the channel closed at the next
// change when that is nothing yet.
func (w *watcher) poll() ([]registry.Instance, <-chan struct{}, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err := w.down; err != nil {
		w.down, w.fresh = nil, true
		return nil, nil, err
	}
	if w.synced && (w.fresh || differ(w.cur, w.curVersion, w.last, w.lastVersion)) {
		w.last, w.lastVersion, w.fresh = w.cur, w.curVersion, false
		// A shallow copy: cur stays the watcher's, the Metadata maps are
		// shared, read-only by the contract of Next.
		out := make([]registry.Instance, len(w.cur))
		copy(out, w.cur)
		return out, nil, nil
	}
	return nil, w.changed, nil
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
			list, version, next, err := w.load(conn)
			if w.ctx.Err() != nil {
				return
			}
			if err == nil && w.publish(list, version, outages) {
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
// creation while it does not exist) and reads the instances, sorted by
// ID, with their list version. It reads the data of the children it has
// not read before; the others keep what the last load read, unless the
// service node's child version shows that a child was deleted and created
// again since (a Register replacing an instance's data does that): then it
// reads every child again. The list of children names comes whole from
// ZooKeeper at every change: finding the new names costs a map lookup per
// child. load never runs twice at once: it alone uses w.read, w.list and
// w.version.
func (w *watcher) load(conn *zk.Conn) ([]registry.Instance, uint64, <-chan zk.Event, error) {
	for range maxAttempts {
		children, stat, events, err := conn.ChildrenW(w.path)
		if errors.Is(err, zk.ErrNoNode) {
			w.read = readState{}
			exists, _, created, err := conn.ExistsW(w.path)
			if err != nil {
				return nil, 0, nil, err
			}
			if exists {
				continue // created in between; watch its children
			}
			list, version := w.settle([]registry.Instance{})
			return list, version, created, nil
		}
		if err != nil {
			return nil, 0, nil, err
		}
		var list []registry.Instance
		if prev := w.read.nodes; prev != nil && stat.Czxid == w.read.czxid {
			list, err = w.update(conn, children, stat, prev)
		} else {
			list, err = w.readAll(conn, children, stat)
		}
		if err != nil {
			w.read = readState{}
			return nil, 0, nil, err
		}
		return list, w.version, events, nil
	}
	return nil, 0, nil, fmt.Errorf("%s appeared and vanished %d times", w.path, maxAttempts)
}

// readAll reads the data of every child and makes it the list.
func (w *watcher) readAll(conn *zk.Conn, children []string, stat *zk.Stat) ([]registry.Instance, error) {
	got, err := w.fetch(conn, children)
	if err != nil {
		return nil, err
	}
	nodes := make(map[string]*childNode, len(got))
	list := make([]registry.Instance, 0, len(got))
	for _, n := range got {
		nodes[n.name] = n
		if n.ok {
			list = append(list, n.in)
		}
	}
	slices.SortFunc(list, registry.CompareInstances)
	w.read = readState{czxid: stat.Czxid, cversion: stat.Cversion, nodes: nodes}
	list, _ = w.settle(list)
	return list, nil
}

// update makes the list of children from prev, the nodes the last load
// read, and the data of the new children. It reads every child again when
// the child version shows that a child kept was created again.
func (w *watcher) update(conn *zk.Conn, children []string, stat *zk.Stat, prev map[string]*childNode) ([]registry.Instance, error) {
	gen := w.read.gen + 1
	var fresh []string
	kept := 0
	for _, child := range children {
		if n := prev[child]; n != nil {
			n.seen = gen
			kept++
		} else {
			fresh = append(fresh, child)
		}
	}
	// Each creation and deletion of a child adds one to Cversion.
	// More than the names that came and went means that a name
	// kept was deleted and created again: its data may differ.
	removed := len(prev) - kept
	if int64(stat.Cversion)-int64(w.read.cversion) != int64(len(fresh)+removed) {
		return w.readAll(conn, children, stat)
	}
	got, err := w.fetch(conn, fresh)
	if err != nil {
		return nil, err
	}
	// The changes of the list, by ID: instances gone (nil in) and new.
	var changes []listChange
	if removed > 0 {
		for name, n := range prev {
			if n.seen != gen {
				delete(prev, name)
				if n.ok {
					changes = append(changes, listChange{id: name})
				}
			}
		}
	}
	for _, n := range got {
		n.seen = gen
		prev[n.name] = n
		if n.ok {
			changes = append(changes, listChange{id: n.name, in: &n.in})
		}
	}
	w.read.cversion, w.read.gen = stat.Cversion, gen
	if len(changes) == 0 {
		return w.list, nil
	}
	slices.SortFunc(changes, func(a, b listChange) int { return strings.Compare(a.id, b.id) })
	// A new slice, for the old one may be held by Next's callers: the
	// runs between the changes are copied whole.
	old := w.list
	list := make([]registry.Instance, 0, len(old)+len(changes))
	pos := 0
	for _, c := range changes {
		i, found := slices.BinarySearchFunc(old[pos:], c.id, func(in registry.Instance, id string) int {
			return strings.Compare(in.ID, id)
		})
		list = append(list, old[pos:pos+i]...)
		pos += i
		if found {
			pos++ // gone
		}
		if c.in != nil {
			list = append(list, *c.in)
		}
	}
	list = append(list, old[pos:]...)
	w.list = list
	w.version++
	return list, nil
}

// listChange is an instance new to the list (in set) or gone from it (in
// nil).
type listChange struct {
	id string
	in *registry.Instance
}

// settle makes list, read whole, the list of load: it returns the list of
// the last load instead when they are equal, so that its version holds.
func (w *watcher) settle(list []registry.Instance) ([]registry.Instance, uint64) {
	if w.version > 0 && registry.EqualSets(w.list, list) {
		return w.list, w.version
	}
	w.list = list
	w.version++
	return list, w.version
}

// differ reports whether the list a of version va differs from b of
// version vb; versions one apart differ, by the rule of load's versions.
func differ(a []registry.Instance, va uint64, b []registry.Instance, vb uint64) bool {
	switch {
	case va == vb:
		return false
	case va == vb+1 || vb == va+1:
		return true
	}
	return !registry.EqualSets(a, b)
}

// readState is what the last load read: the service node's creation
// zxid and child version, and each child's decoded data.
type readState struct {
	czxid    int64
	cversion int32
	nodes    map[string]*childNode // by name; nil: read every child
	gen      uint32                // of the last load, for childNode.seen
}

// childNode is a child's name and data as decoded; ok is false for a
// node that holds no instance (skipped, and logged once). seen is the gen
// of the last load that listed it.
type childNode struct {
	name string
	in   registry.Instance
	ok   bool
	seen uint32
}

// fetchHook, set only by tests, is called by each load of a watcher of r
// with the number of children whose data it reads.
var fetchHook func(r *Registry, n int)

// fetchParallel bounds the Gets load has in flight at once: the client
// pipelines them on the session's connection.
const fetchParallel = 32

// fetch reads and decodes the children named, up to fetchParallel at
// once. A child gone
// since the list is left out: its deletion has fired the child watch.
// After a failure the reads not started are skipped.
func (w *watcher) fetch(conn *zk.Conn, names []string) ([]*childNode, error) {
	if fetchHook != nil {
		fetchHook(w.r, len(names))
	}
	if len(names) == 0 {
		return nil, nil
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
			got[i].name = name
			got[i].in, got[i].ok = w.decode(name, data)
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	out := make([]*childNode, 0, len(names))
	for i := range names {
		if !gone[i] {
			out = append(out, &got[i])
		}
	}
	return out, nil
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

// publish makes list of the given version, read after the outages-th
// outage, the current set if it differs from it or the set was out of
// date. It returns false when an outage was reported since: list may be
// older than it.
func (w *watcher) publish(list []registry.Instance, version uint64, outages int) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.outages != outages {
		return false
	}
	if w.synced && !differ(w.cur, w.curVersion, list, version) {
		return true
	}
	w.cur, w.curVersion, w.synced = list, version, true
	w.r.log.Debug("watch: set read", "path", w.path, "instances", len(list))
	close(w.changed)
	w.changed = make(chan struct{})
	return true
}
