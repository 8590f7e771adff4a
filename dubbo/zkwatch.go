// Watching Dubbo providers: the providers node of an interface, filtered as Java's consumers filter it.

package dubbo

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

// Watch follows the Dubbo providers of service, a Dubbo service key
// [group/]interface[:version] ("*" for any group or version): the
// children of {Root}/{interface}/providers that Java's UrlUtils.isMatch
// gives a consumer of that key, of protocol dubbo. The override URLs
// under {Root}/{interface}/configurators apply as on a Java consumer: a
// provider they disable (disabled=true) is left out, and a weight they
// set is its weight. Each provider becomes an instance whose ID is the
// node's name, Addr the URL's address, Weight the URL's weight (default
// 100; 0 becomes 1) and Metadata the URL's other parameters, by their
// Dubbo names. ctx bounds only this call, as RequestTimeout does; the
// watch lasts until Stop or Close.
//
// registry.Cache refuses a service name with '/': through a Cache, a key
// with a group is followed in Dubbo's colon-separated form,
// interface:version:group, which Watch reads too.
func (r *Registry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	key, err := parseServiceKey(service)
	if err != nil {
		return nil, fmt.Errorf("dubbo: watch: %w", err)
	}
	rd, err := r.readerFor()
	if err != nil {
		return nil, fmt.Errorf("dubbo: watch %s: %w", service, err)
	}
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RequestTimeout)
	defer cancel()
	wctx, wcancel := context.WithCancel(context.Background())
	w := &watcher{
		rd:      rd,
		key:     key,
		service: service,
		path:    r.servicePath(key.iface),
		ctx:     wctx,
		cancel:  wcancel,
		kick:    make(chan struct{}, 1),
		changed: make(chan struct{}),
		fresh:   true,
	}
	type result struct {
		list   []registry.Instance
		events watchEvents
		err    error
	}
	res := make(chan result, 1)
	// The client's calls take no context: the first read runs on its own,
	// and ctx bounds the wait for it.
	if !rd.spawn(func() {
		if err := rd.waitSession(ctx); err != nil {
			res <- result{err: err}
			return
		}
		list, events, err := w.load(watchEvents{})
		res <- result{list, events, err}
	}) {
		wcancel()
		return nil, fmt.Errorf("dubbo: watch %s: %w", service, registry.ErrClosed)
	}
	var first result
	select {
	case first = <-res:
	case <-ctx.Done():
		first.err = fmt.Errorf("%w: %w", registry.ErrUnavailable, ctx.Err())
	}
	if first.err != nil {
		wcancel()
		return nil, fmt.Errorf("dubbo: watch %s: %w", service, first.err)
	}
	w.cur, w.synced = first.list, true
	rd.mu.Lock()
	defer rd.mu.Unlock()
	if rd.isClosed() {
		wcancel()
		return nil, fmt.Errorf("dubbo: watch %s: %w", service, registry.ErrClosed)
	}
	rd.watchers[w] = struct{}{}
	if rd.down {
		w.outage()
	}
	rd.wg.Go(func() { w.run(first.events) })
	return w, nil
}

// watcher is a registry.Watcher of one Dubbo service key.
type watcher struct {
	rd      *reader
	key     serviceKey
	service string
	path    string          // the interface's node
	ctx     context.Context // ends with Stop
	cancel  context.CancelFunc
	kick    chan struct{} // cap 1: wakes run to read again after an outage

	mu      sync.Mutex // guards following
	cur     []registry.Instance
	synced  bool          // cur was read since the last outage
	down    error         // the outage not yet reported by Next
	outages int           // counts outages, so that a read begun before one is not taken for after
	changed chan struct{} // closed and replaced when the fields above change
	last    []registry.Instance
	fresh   bool // Next returns the set even if unchanged: at first and after an outage

	skipped map[string]bool // run's alone: node names logged as undecodable
}

// Next returns the current set the first time, then blocks until the set
// differs from the one it last returned. After the session has been down
// for the session timeout it returns an error wrapping
// registry.ErrUnavailable once; the next call returns the full set once
// the session is back and the set has been read again.
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
			out := slices.Clone(w.cur)
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
	w.rd.mu.Lock()
	delete(w.rd.watchers, w)
	w.rd.mu.Unlock()
}

// outage marks the set as out of date, for Next to report, and makes run
// read it again once the session is back.
func (w *watcher) outage() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.synced {
		return
	}
	w.synced = false
	w.outages++
	w.down = fmt.Errorf("dubbo: watching %s: %w: no session with ZooKeeper for the session timeout (%v)",
		w.service, registry.ErrUnavailable, w.rd.sessionTimeout())
	close(w.changed)
	w.changed = make(chan struct{})
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// run reads the set again after each event of the child watch, re-arming
// it, and after an outage. While ZooKeeper is unreachable it keeps the
// last set: the client restores its watches on reconnection, and a session
// expiry ends them with an event, after which run waits for the new
// session and reads again.
func (w *watcher) run(events watchEvents) {
	const minDelay, maxDelay = 100 * time.Millisecond, 2 * time.Second
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	defer retry.Stop()
	for {
		select {
		case <-events.providers:
			events.providers = nil
		case <-events.configurators:
			events.configurators = nil
		case <-w.kick:
		case <-w.ctx.Done():
			return
		}
		for delay := minDelay; ; delay = min(2*delay, maxDelay) {
			if err := w.rd.waitSession(w.ctx); err != nil {
				return // stopped or closed
			}
			outages := w.outageCount()
			list, next, err := w.load(events)
			if w.ctx.Err() != nil {
				return
			}
			events = next // the watches set, even by a load that failed half-way
			if err == nil {
				if w.publish(list, outages) {
					break
				}
				continue // an outage was reported while reading: read again
			}
			w.rd.r.log.Debug("watch: read failed; keeping the last set", "path", w.path, "err", err, "retry_in", delay)
			retry.Reset(delay)
			select {
			case <-retry.C:
			case <-w.ctx.Done():
				return
			}
		}
	}
}

// load reads the children of the providers and configurators nodes and
// returns the matching providers, overrides applied, sorted by ID. It sets
// a watch on each node whose channel in ev is nil (the watch fired, or
// there was none), on its children or, while it does not exist, on its
// creation; a watch still set is kept, for the client keeps every watch
// set until it fires. It returns the channels to wait on.
func (w *watcher) load(ev watchEvents) ([]registry.Instance, watchEvents, error) {
	names, provEv, err := w.children(w.path+"/"+categoryProviders, ev.providers)
	if err != nil {
		return nil, ev, err
	}
	ev.providers = provEv
	confNames, confEv, err := w.children(w.path+"/"+categoryConfigurators, ev.configurators)
	if err != nil {
		return nil, ev, err
	}
	ev.configurators = confEv
	overrides := overridesFor(w.key, confNames, func(name string, err error) {
		w.skip(w.path+"/"+categoryConfigurators+"/"+name, err)
	})
	list := make([]registry.Instance, 0, len(names))
	for _, child := range names {
		if in, ok := w.decode(child, overrides); ok {
			list = append(list, in)
		}
	}
	slices.SortFunc(list, registry.CompareInstances)
	return list, ev, nil
}

// watchEvents are the channels of a load's two child watches.
type watchEvents struct {
	providers, configurators <-chan gozk.Event
}

// children returns the children of p and a watch on them, or, while p
// does not exist, none and a watch on its creation. With a watch set
// already (armed), it reads the children and returns armed.
func (w *watcher) children(p string, armed <-chan gozk.Event) ([]string, <-chan gozk.Event, error) {
	conn := w.rd.conn
	if armed != nil {
		names, _, err := conn.Children(p)
		if errors.Is(err, gozk.ErrNoNode) {
			return nil, armed, nil
		}
		return names, armed, err
	}
	for range 5 {
		names, _, events, err := conn.ChildrenW(p)
		if errors.Is(err, gozk.ErrNoNode) {
			exists, _, created, err := conn.ExistsW(p)
			if err != nil {
				return nil, nil, err
			}
			if exists {
				continue // created in between: watch its children
			}
			return nil, created, nil
		}
		if err != nil {
			return nil, nil, err
		}
		return names, events, nil
	}
	return nil, nil, fmt.Errorf("%s appeared and vanished 5 times", p)
}

// decode makes an instance of a provider node's name, if it is a provider
// the key matches and no override disables it.
func (w *watcher) decode(child string, overrides []override) (registry.Instance, bool) {
	raw, err := zkDecode(child)
	var u providerURL
	if err == nil {
		u, err = parseProviderURL(raw)
	}
	if err == nil {
		if _, port, _ := splitAddr(u.addr); port == 0 {
			err = fmt.Errorf("address %q has no port", u.addr)
		}
	}
	if err != nil {
		w.skip(w.path+"/"+categoryProviders+"/"+child, err)
		return registry.Instance{}, false
	}
	if !w.key.matches(u) {
		return registry.Instance{}, false
	}
	if u = apply(u, overrides); disabled(u) {
		return registry.Instance{}, false
	}
	return providerInstance(w.service, child, u), true
}

// skip logs, once per node, a node whose name is not a Dubbo URL.
func (w *watcher) skip(p string, err error) {
	if w.skipped == nil {
		w.skipped = make(map[string]bool)
	}
	if !w.skipped[p] {
		w.skipped[p] = true
		w.rd.r.log.Warn("skipping a node whose name is not a Dubbo URL", "path", p, "err", err)
	}
}

func (w *watcher) outageCount() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.outages
}

// publish makes list, read after the outages-th outage, the current set.
// It returns false when an outage was reported since: list may be older.
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
	close(w.changed)
	w.changed = make(chan struct{})
	return true
}
