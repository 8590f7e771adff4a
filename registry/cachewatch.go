// The watch goroutine of a Cache: it follows one service and stores what the registry pushes.

package registry

import (
	"context"
	"errors"
	"math/rand/v2"
	"time"
)

// watchCallTimeout bounds one Watch call of the cache, for backends that
// would not bound it themselves.
const watchCallTimeout = 30 * time.Second

// watch follows one service until Close, watching again with backoff
// after each failure, unless the registry is closed or refuses the
// service (ErrInvalid): retrying would not help.
func (c *Cache) watch(e *cacheEntry) {
	defer c.work.exit()
	delay := c.cfg.MinRetryDelay
	for {
		ctx, cancel := context.WithTimeout(c.ctx, watchCallTimeout)
		w, err := c.r.Watch(ctx, e.service)
		cancel()
		if err == nil {
			e.mu.Lock()
			e.watcher = w
			e.mu.Unlock()
			var progressed bool
			progressed, err = c.follow(e, w)
			e.mu.Lock()
			mine := e.watcher == w // else Close took it to stop it
			e.watcher = nil
			e.mu.Unlock()
			if mine {
				w.Stop()
			}
			if progressed {
				delay = c.cfg.MinRetryDelay
			}
		}
		if c.ctx.Err() != nil {
			return
		}
		c.fail(e, err)
		if errors.Is(err, ErrInvalid) {
			return // logged by fail
		}
		if errors.Is(err, ErrClosed) {
			c.log.Error("registry closed under the cache; keeping the last known instances", "service", e.service)
			return
		}
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-t.C:
		case <-c.ctx.Done():
			t.Stop()
			return
		}
		delay = min(2*delay, c.cfg.MaxRetryDelay)
	}
}

// follow applies the watcher's sets until Next fails.
func (c *Cache) follow(e *cacheEntry, w Watcher) (progressed bool, err error) {
	for {
		set, err := w.Next(c.ctx)
		if err != nil {
			return progressed, err
		}
		c.apply(e, set)
		progressed = true
		if c.ctx.Err() != nil {
			return progressed, c.ctx.Err() // closed during a subscriber's call: nothing more
		}
	}
}

// apply stores a set the registry pushed, saves it to the snapshot file
// and tells the subscribers when the list changed. The file is written
// first: it must not wait for the subscribers, and once one of them has
// seen a list (and perhaps closed the cache) nothing more is done.
func (c *Cache) apply(e *cacheEntry, set []Instance) {
	if st := c.store(e, set); st != nil {
		c.snap.save(e.service, st.instances)
		e.publish(st)
	}
}

// store stores a pushed set; it returns the new state when the list
// changed.
func (c *Cache) store(e *cacheEntry, set []Instance) *cacheState {
	e.mu.Lock()
	defer e.mu.Unlock()
	prev := e.state.Load()
	if prev != nil && prev.stale {
		c.log.Info("registry reachable again", "service", e.service, "instances", len(set))
	}
	e.lastErr, e.failLogged = nil, false
	if len(set) == 0 && c.cfg.EmptyProtection == ProtectEmpty && prev != nil && len(prev.instances) > 0 {
		if !prev.suspect {
			c.log.Warn("registry reports no instances; keeping the last known ones as suspect", "service", e.service, "instances", len(prev.instances))
		}
		// Instances from the snapshot stay stale: the registry has not
		// confirmed them.
		e.state.Store(&cacheState{instances: prev.instances, version: prev.version, suspect: true,
			snapshot: prev.snapshot, stale: prev.snapshot})
		return nil
	}
	// A watcher returns its set sorted by ID and the set is the cache's to
	// keep: a copy only for a watcher that breaks that order.
	ins, strict := set, SortedByID(set)
	if !strict {
		ins = SortedCopy(set)
	}
	if ins == nil {
		ins = []Instance{}
	}
	if prev != nil && sameList(prev.instances, ins, strict) {
		e.state.Store(&cacheState{instances: prev.instances, version: prev.version})
		return nil
	}
	st := &cacheState{instances: ins, version: 1}
	if prev != nil {
		st.version = prev.version + 1
	}
	e.state.Store(st)
	if prev == nil {
		close(e.ready)
	}
	return st
}

// sameList reports whether the cache's list prev holds the instances of
// ins, sorted; strict says that the IDs of ins are strictly increasing.
func sameList(prev, ins []Instance, strict bool) bool {
	if !strict {
		return EqualSets(prev, ins)
	}
	// prev is sorted too: were it to hold the same instances, its IDs
	// would be distinct, and equal to those of ins side by side.
	if len(prev) != len(ins) {
		return false
	}
	for i := range ins {
		if !SameInstance(prev[i], ins[i]) {
			return false
		}
	}
	return true
}

// fail records a failed watch: the instances are kept and marked stale.
// An error wrapping ErrInvalid says the registry refuses the service:
// lookups waiting for a first list return it at once.
func (c *Cache) fail(e *cacheEntry, err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.lastErr = err
	select {
	case <-e.failed:
	default:
		close(e.failed)
	}
	prev := e.state.Load()
	if errors.Is(err, ErrInvalid) {
		e.refused = true
		c.log.Error("the registry refuses the service; not watching it", "service", e.service, "err", err)
		if prev != nil && !prev.stale {
			next := *prev
			next.stale = true
			e.state.Store(&next)
		}
		return
	}
	if prev == nil {
		if !e.failLogged {
			e.failLogged = true
			c.log.Warn("registry unreachable; no instances known yet", "service", e.service, "err", err)
		}
		return
	}
	if prev.stale {
		return
	}
	next := *prev
	next.stale = true
	e.state.Store(&next)
	c.log.Warn("registry unreachable; keeping the last known instances", "service", e.service, "instances", len(prev.instances), "err", err)
}
