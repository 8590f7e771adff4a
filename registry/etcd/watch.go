// The Watcher: list the prefix, then watch from the listed revision + 1.

package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"

	"github.com/dabbrpc/dabb/registry"
)

// Watch lists the service's instances (bounded by ctx and RequestTimeout,
// so Watch fails when etcd is down) and then follows them. The watch
// outlives ctx; it ends with Stop or Close.
func (r *Registry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	if err := registry.ValidateService(service); err != nil {
		return nil, fmt.Errorf("etcd: watch: %w", err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, registry.ErrClosed
	}
	if r.conn == nil {
		r.conn = newConnMonitor(r.outage)
		r.wg.Add(1)
		go r.conn.run(r.ctx, &r.wg, r.cli)
	}
	r.mu.Unlock()
	w := &watcher{
		r:       r,
		service: service,
		prefix:  r.servicePrefix(service),
		changed: make(chan struct{}),
		stop:    make(chan struct{}),
		fresh:   true,
	}
	w.ctx, w.cancel = context.WithCancel(r.ctx)
	lctx, cancel := r.callContext(ctx)
	defer cancel()
	rev, err := w.list(lctx)
	if err != nil {
		w.cancel()
		return nil, fmt.Errorf("etcd: watch %s: %w", service, err)
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		w.cancel()
		return nil, registry.ErrClosed
	}
	r.watchers[w] = struct{}{}
	r.wg.Add(1)
	r.mu.Unlock()
	if _, up := r.conn.state(); !up {
		w.outage() // etcd went away after the list, before r.outage could see w
	}
	go w.run(rev)
	return w, nil
}

// watcher follows one service: a goroutine applies etcd's events to set;
// Next returns a copy of set when an instance changed since it last
// returned one.
type watcher struct {
	r       *Registry
	service string
	prefix  string
	ctx     context.Context // ends at Stop or Close
	cancel  context.CancelFunc
	stop    chan struct{} // closed by Stop
	once    sync.Once

	mu sync.Mutex // guards following
	// set holds the instances sorted by ID, IDs distinct. An event
	// changes it in place: Next returns copies.
	set     []registry.Instance
	synced  bool          // set mirrors etcd (listed since the last outage)
	down    error         // the outage not yet reported by Next
	changed chan struct{} // closed and replaced whenever the fields above change
	ended   error         // ErrClosed after Close
	fresh   bool          // Next returns the set even if unchanged: first call, after an error
	// before holds, for each ID changed since Next last returned the set,
	// the instance it had then (ok false: none), so that Next compares
	// only those instances with what it returned.
	before map[string]priorInstance

	cancelFollow context.CancelFunc // ends the current watch
}

// Next returns the current set at once on the first call, then blocks
// until it differs from the set last returned. When the connection to
// etcd is lost it returns an error wrapping ErrUnavailable once; the next
// call returns the full set as soon as etcd answers again.
func (w *watcher) Next(ctx context.Context) ([]registry.Instance, error) {
	return registry.WaitNext(ctx, w.stop, w.poll)
}

// poll returns what Next returns now, or the channel closed at the next
// change when that is nothing yet.
func (w *watcher) poll() ([]registry.Instance, <-chan struct{}, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended != nil {
		return nil, nil, w.ended
	}
	if w.down != nil {
		err := w.down
		w.down = nil
		w.fresh = true
		return nil, nil, err
	}
	if w.synced && (w.fresh || w.changedLocked()) {
		w.fresh = false
		w.forgetBeforeLocked()
		// A shallow copy: the Metadata maps stay shared, read-only by
		// the contract of Next.
		out := make([]registry.Instance, len(w.set))
		copy(out, w.set)
		return out, nil, nil
	}
	return nil, w.changed, nil
}

// Stop ends the watch; a blocked Next returns registry.ErrWatcherStopped.
func (w *watcher) Stop() {
	w.once.Do(func() {
		close(w.stop)
		w.cancel()
		w.r.mu.Lock()
		delete(w.r.watchers, w)
		w.r.mu.Unlock()
	})
}

// end makes every later Next return err.
func (w *watcher) end(err error) {
	w.mu.Lock()
	w.ended = err
	w.notifyLocked()
	w.mu.Unlock()
	w.cancel()
}

func (w *watcher) notifyLocked() {
	close(w.changed)
	w.changed = make(chan struct{})
}

// priorInstance is an instance as Next last returned it; ok is false for
// an ID it did not return.
type priorInstance struct {
	in registry.Instance
	ok bool
}

// changedLocked reports whether the set differs from the one Next
// returned last, looking only at the IDs changed since. When it does not,
// it forgets them.
func (w *watcher) changedLocked() bool {
	for id, was := range w.before {
		in, ok := w.find(id)
		if ok != was.ok || (ok && !registry.SameInstance(in, was.in)) {
			return true
		}
	}
	w.forgetBeforeLocked()
	return false
}

// forgetBeforeLocked empties before. A map that held many IDs (the first
// list) is dropped rather than cleared, for clearing costs its capacity.
func (w *watcher) forgetBeforeLocked() {
	if len(w.before) > 16 {
		w.before = nil
		return
	}
	clear(w.before)
}

// noteLocked records what ID had when Next last returned the set, before
// the first change of it since. Nothing is recorded while Next is to
// return the set anyway.
func (w *watcher) noteLocked(id string, in registry.Instance, ok bool) {
	if w.fresh {
		return
	}
	if _, seen := w.before[id]; seen {
		return
	}
	if w.before == nil {
		w.before = make(map[string]priorInstance)
	}
	w.before[id] = priorInstance{in, ok}
}

// find returns the instance of set with the ID id.
func (w *watcher) find(id string) (registry.Instance, bool) {
	if i, ok := w.search(id); ok {
		return w.set[i], true
	}
	return registry.Instance{}, false
}

// search returns where id is or would be in set.
func (w *watcher) search(id string) (int, bool) {
	return slices.BinarySearchFunc(w.set, id, func(in registry.Instance, id string) int {
		return strings.Compare(in.ID, id)
	})
}

// putLocked adds in to set, or replaces the instance of its ID; it
// reports whether that changed the set.
func (w *watcher) putLocked(in registry.Instance) bool {
	i, found := w.search(in.ID)
	if !found {
		w.noteLocked(in.ID, registry.Instance{}, false)
		w.set = slices.Insert(w.set, i, in)
		return true
	}
	if registry.SameInstance(w.set[i], in) {
		return false // a put of the same value, e.g. a lease renewed by a new Register
	}
	w.noteLocked(in.ID, w.set[i], true)
	w.set[i] = in
	return true
}

// removeLocked removes the instance with the ID id from set; it reports
// whether there was one.
func (w *watcher) removeLocked(id string) bool {
	i, found := w.search(id)
	if !found {
		return false
	}
	w.noteLocked(id, w.set[i], true)
	w.set = slices.Delete(w.set, i, i+1)
	return true
}

// list replaces set with etcd's and returns the revision it read at.
// Instances that did not change keep their old values, whose strings and
// maps the sets Next returned before share.
func (w *watcher) list(ctx context.Context) (int64, error) {
	resp, err := w.r.cli.Get(ctx, w.prefix, clientv3.WithPrefix())
	if err != nil {
		return 0, fmt.Errorf("list %s: %w", w.prefix, err)
	}
	set := make([]registry.Instance, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		if in, ok := w.decode(kv.Key, kv.Value); ok {
			set = append(set, in)
		}
	}
	// etcd returns a range sorted by key, so by ID within the prefix.
	if !registry.SortedByID(set) {
		slices.SortFunc(set, registry.CompareInstances)
		set = slices.CompactFunc(set, func(a, b registry.Instance) bool { return a.ID == b.ID })
	}
	w.mu.Lock()
	old := w.set
	i := 0
	for j := range set {
		for i < len(old) && old[i].ID < set[j].ID {
			w.noteLocked(old[i].ID, old[i], true)
			i++
		}
		switch {
		case i < len(old) && old[i].ID == set[j].ID && registry.SameInstance(old[i], set[j]):
			set[j] = old[i]
			i++
		case i < len(old) && old[i].ID == set[j].ID:
			w.noteLocked(old[i].ID, old[i], true)
			i++
		default:
			w.noteLocked(set[j].ID, registry.Instance{}, false)
		}
	}
	for ; i < len(old); i++ {
		w.noteLocked(old[i].ID, old[i], true)
	}
	w.set, w.synced, w.down = set, true, nil
	w.notifyLocked()
	w.mu.Unlock()
	return resp.Header.Revision, nil
}

// decode turns a key and its value into an instance of the service; keys
// deeper than <prefix>/<service>/<id> and values that are not an Instance
// are skipped (and logged).
func (w *watcher) decode(key, value []byte) (registry.Instance, bool) {
	id := w.idOf(key)
	if registry.ValidateID(id) != nil {
		return registry.Instance{}, false
	}
	var in registry.Instance
	if err := json.Unmarshal(value, &in); err != nil {
		w.r.log.Warn("skipping a key whose value is not an instance", "key", string(key), "err", err)
		return registry.Instance{}, false
	}
	in.Service, in.ID = w.service, id
	if in.Addr == "" {
		w.r.log.Warn("skipping an instance without addr", "key", string(key))
		return registry.Instance{}, false
	}
	return in, true
}

// run keeps set current: watch from rev+1; list again after a compaction,
// a broken watch or an outage (once etcd is reachable again).
func (w *watcher) run(rev int64) {
	defer w.r.wg.Done()
	delay := 100 * time.Millisecond
	const maxDelay = 2 * time.Second
	for {
		if rev == 0 {
			if !w.r.conn.waitUp(w.ctx) {
				return
			}
			ctx, cancel := w.r.callContext(w.ctx)
			var err error
			rev, err = w.list(ctx)
			cancel()
			if w.ctx.Err() != nil {
				return
			}
			if err != nil {
				w.r.log.Debug("list failed, retrying", "service", w.service, "err", err)
				if !w.sleep(delay) {
					return
				}
				delay = min(2*delay, maxDelay)
				continue
			}
			delay = 100 * time.Millisecond
		}
		if hook := w.r.testHookAfterList; hook != nil {
			hook(w.service)
		}
		rev = w.follow(rev)
		if w.ctx.Err() != nil {
			return
		}
	}
}

// follow applies events from rev+1 on, until the watch breaks or an
// outage cancels it. It returns the revision to resume from, or 0 when
// the watcher must list again.
func (w *watcher) follow(rev int64) int64 {
	ctx, cancel := context.WithCancel(clientv3.WithRequireLeader(w.ctx))
	defer cancel()
	w.mu.Lock()
	if !w.synced { // an outage began since the list
		w.mu.Unlock()
		return 0
	}
	w.cancelFollow = cancel
	w.mu.Unlock()
	defer func() {
		w.mu.Lock()
		w.cancelFollow = nil
		w.mu.Unlock()
	}()
	ch := w.r.cli.Watch(ctx, w.prefix, clientv3.WithPrefix(), clientv3.WithRev(rev+1))
	for resp := range ch {
		if resp.CompactRevision != 0 {
			w.r.log.Info("watch revision compacted, listing again", "service", w.service, "compacted", resp.CompactRevision)
			return 0
		}
		if err := resp.Err(); err != nil || resp.Canceled {
			w.r.log.Info("watch broken, listing again", "service", w.service, "err", err)
			return 0
		}
		if len(resp.Events) > 0 {
			w.apply(resp.Events)
		}
		if resp.Header.Revision > rev {
			rev = resp.Header.Revision
		}
	}
	return 0 // canceled by an outage, Stop or Close; or the client closed
}

// outage marks every watcher's set as out of date, for Next to report,
// and cancels their watches; they list again once etcd is back.
func (r *Registry) outage() {
	r.log.Warn("etcd unreachable; watchers keep their last sets", "endpoints", r.cfg.Endpoints)
	r.mu.Lock()
	ws := make([]*watcher, 0, len(r.watchers))
	for w := range r.watchers {
		ws = append(ws, w)
	}
	r.mu.Unlock()
	for _, w := range ws {
		w.outage()
	}
}

// outage marks set as out of date, for Next to report.
func (w *watcher) outage() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return
	}
	w.synced = false
	w.down = fmt.Errorf("%w: watching %s: no connection to %v", ErrUnavailable, w.service, w.r.cfg.Endpoints)
	if w.cancelFollow != nil {
		w.cancelFollow()
	}
	w.notifyLocked()
}

func (w *watcher) apply(events []*clientv3.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	changed := false
	for _, ev := range events {
		switch ev.Type {
		case clientv3.EventTypePut:
			if in, ok := w.decode(ev.Kv.Key, ev.Kv.Value); ok {
				changed = w.putLocked(in) || changed
			} else {
				changed = w.removeLocked(w.idOf(ev.Kv.Key)) || changed
			}
		case clientv3.EventTypeDelete:
			changed = w.removeLocked(w.idOf(ev.Kv.Key)) || changed
		}
	}
	if changed {
		w.notifyLocked()
	}
}

// idOf returns the instance ID a key of the prefix names.
func (w *watcher) idOf(key []byte) string {
	return strings.TrimPrefix(string(key), w.prefix)
}

// sleep waits about d (with jitter); false when the watcher ended.
func (w *watcher) sleep(d time.Duration) bool { return jitteredSleep(w.ctx, d) }

// jitteredSleep waits between half of d and d before a retry; false means
// ctx ended first.
func jitteredSleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d/2 + rand.N(d/2+1))
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// Unreachable implements registry.Reachability. It returns an error
// wrapping ErrUnavailable, naming the endpoints, when every endpoint
// failed (TRANSIENT_FAILURE) and the client has not been READY since. It
// returns nil when the client is connected, has not failed yet, or the
// registry is closed.
func (r *Registry) Unreachable() error {
	r.mu.Lock()
	closed, mon := r.closed, r.conn
	r.mu.Unlock()
	if closed {
		return nil
	}
	st := r.cli.ActiveConnection().GetState()
	down := st == connectivity.TransientFailure
	if mon != nil && (st == connectivity.Connecting || st == connectivity.Idle) {
		_, up := mon.state()
		down = !up
	}
	if !down {
		return nil
	}
	return fmt.Errorf("%w: %s unreachable (connection %v)", ErrUnavailable, strings.Join(r.cfg.Endpoints, ","), st)
}

// connMonitor follows the state of the client's gRPC connection: etcd is
// unreachable when the connection is in TRANSIENT_FAILURE (every endpoint
// failed) and reachable again when it is READY.
type connMonitor struct {
	onDown func() // called when etcd becomes unreachable

	mu      sync.Mutex // guards following
	down    bool
	changed chan struct{}
}

func newConnMonitor(onDown func()) *connMonitor {
	return &connMonitor{onDown: onDown, changed: make(chan struct{})}
}

func (m *connMonitor) run(ctx context.Context, wg *sync.WaitGroup, cli *clientv3.Client) {
	defer wg.Done()
	conn := cli.ActiveConnection()
	for {
		s := conn.GetState()
		if m.set(s) {
			m.onDown()
		}
		if !conn.WaitForStateChange(ctx, s) {
			return
		}
	}
}

// set records a connection state and reports whether etcd just became
// unreachable.
func (m *connMonitor) set(s connectivity.State) (wentDown bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	down := m.down
	switch s {
	case connectivity.TransientFailure, connectivity.Shutdown:
		down = true
	case connectivity.Ready:
		down = false
	}
	if down == m.down {
		return false
	}
	m.down = down
	close(m.changed)
	m.changed = make(chan struct{})
	return down
}

// state returns a channel closed at the next change and whether etcd is
// reachable.
func (m *connMonitor) state() (changed <-chan struct{}, up bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed, !m.down
}

// waitUp blocks until etcd is reachable; false when ctx ends first.
func (m *connMonitor) waitUp(ctx context.Context) bool {
	for {
		changed, up := m.state()
		if up {
			return true
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
	}
}
