// The tracker that lets a Cache's Close wait for its work but not for a subscriber's call.

package registry

import "sync"

// tracker counts the work of a Cache that Close waits for: its watch
// goroutines, its loads and the first calls made by Subscribe, each while
// it is not inside a subscriber's call. Close does not wait for a
// subscriber's call, so that a subscriber may call Close; no call starts
// once Close has begun.
type tracker struct {
	mu      sync.Mutex // guards following
	closed  bool
	n       int           // pieces of work running, not inside a subscriber's call
	changed chan struct{} // closed and replaced when n drops
}

// enter counts a piece of work starting; false once closed. A goroutine is
// counted before it starts, by the code that starts it.
func (t *tracker) enter() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.n++
	return true
}

// exit ends a piece of work that enter counted.
func (t *tracker) exit() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.dropLocked()
}

func (t *tracker) dropLocked() {
	t.n--
	close(t.changed)
	t.changed = make(chan struct{})
}

// call runs fn, a subscriber's call, from counted work; Close does not
// wait for it meanwhile. It reports false, without calling fn, once
// Close has begun.
func (t *tracker) call(fn func()) bool {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return false
	}
	t.dropLocked()
	t.mu.Unlock()
	fn()
	t.mu.Lock()
	t.n++ // counted again until its exit
	t.mu.Unlock()
	return true
}

// close refuses new work and new subscriber calls.
func (t *tracker) close() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
}

// wait waits until no counted work runs outside a subscriber's call.
func (t *tracker) wait() {
	t.mu.Lock()
	defer t.mu.Unlock()
	for t.n > 0 {
		ch := t.changed
		t.mu.Unlock()
		<-ch
		t.mu.Lock()
	}
}
