// Subscriptions to a Cache: callbacks that receive each new instance list.

package registry

import (
	"fmt"
	"sync/atomic"
)

// Subscribe calls fn with the instances of service each time they change.
// The first call comes at once when a list is known. Later calls come from
// the service's watch goroutine, or from the lookup that fell back to the
// snapshot file. Calls never overlap and never go back to an older list.
// fn must return quickly and must not modify the slice nor its Metadata
// maps. It may call the Cache, Close included, and unsubscribe. Subscribe
// starts the watch of the service if no lookup did. Call the returned
// function to stop the calls; no call starts after Close.
func (c *Cache) Subscribe(service string, fn func([]Instance)) (unsubscribe func(), err error) {
	if fn == nil {
		return nil, fmt.Errorf("registry: cache: Subscribe(%s) with a nil func: %w", service, ErrInvalid)
	}
	if err := ValidateService(service); err != nil {
		return nil, fmt.Errorf("registry: cache: %w", err)
	}
	e, err := c.entry(service)
	if err != nil {
		return nil, err
	}
	s := &subscription{c: c, fn: fn, turn: make(chan struct{}, 1)}
	unsubscribe = func() {
		s.done.Store(true)
		e.mu.Lock()
		delete(e.subs, s)
		e.mu.Unlock()
	}
	e.mu.Lock()
	e.subs[s] = struct{}{}
	st := e.state.Load()
	e.mu.Unlock()
	if st != nil {
		// The first call runs on the caller's goroutine, which Close
		// waits for as it waits for the watch goroutines.
		if !c.work.enter() {
			unsubscribe()
			return nil, ErrClosed
		}
		s.deliver(st)
		c.work.exit()
	}
	return unsubscribe, nil
}

// publish delivers st to the subscribers.
func (e *cacheEntry) publish(st *cacheState) {
	e.mu.Lock()
	subs := make([]*subscription, 0, len(e.subs))
	for s := range e.subs {
		subs = append(subs, s)
	}
	e.mu.Unlock()
	for _, s := range subs {
		s.deliver(st)
	}
}

type subscription struct {
	c    *Cache
	fn   func([]Instance)
	done atomic.Bool // unsubscribed

	// turn is a lock that Close can interrupt; it is held during fn and
	// guards version. A goroutine waiting for it gives up at Close: a
	// callback calling Close must not wait for one waiting for it.
	turn    chan struct{}
	version uint64 // of the last list delivered
}

// deliver calls fn with st, unless fn had it or a newer list already, or
// the cache is closed. It is called only from work Close waits for: no
// call starts once Close has begun.
func (s *subscription) deliver(st *cacheState) {
	select {
	case s.turn <- struct{}{}:
	case <-s.c.ctx.Done():
		return
	}
	defer func() { <-s.turn }()
	if s.done.Load() || st.version <= s.version {
		return
	}
	s.c.work.call(func() {
		s.version = st.version
		s.fn(st.instances)
	})
}
