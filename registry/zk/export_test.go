// Test hooks into the keeper and the guard, set per Registry.

package zk

import (
	"sync"
	"testing"
)

var hooks struct {
	mu      sync.Mutex // guards following
	arm     map[*Registry]func(p string)
	session map[*Registry]func(id int64)
	fetch   map[*Registry]func(n int)
}

// init installs the package's hooks before any test runs, so that no
// goroutine reads them while they change.
func init() {
	hooks.arm = make(map[*Registry]func(string))
	hooks.session = make(map[*Registry]func(int64))
	hooks.fetch = make(map[*Registry]func(int))
	fetchHook = func(r *Registry, n int) {
		hooks.mu.Lock()
		fn := hooks.fetch[r]
		hooks.mu.Unlock()
		if fn != nil {
			fn(n)
		}
	}
	armHook = func(r *Registry, p string) {
		hooks.mu.Lock()
		fn := hooks.arm[r]
		hooks.mu.Unlock()
		if fn != nil {
			fn(p)
		}
	}
	sessionHook = func(r *Registry, id int64) {
		hooks.mu.Lock()
		fn := hooks.session[r]
		hooks.mu.Unlock()
		if fn != nil {
			fn(id)
		}
	}
}

// setArmHook makes the guard's repair of r call fn between putting node p
// right and watching it, until t ends.
func setArmHook(t testing.TB, r *Registry, fn func(p string)) {
	hooks.mu.Lock()
	hooks.arm[r] = fn
	hooks.mu.Unlock()
	t.Cleanup(func() {
		hooks.mu.Lock()
		delete(hooks.arm, r)
		hooks.mu.Unlock()
	})
}

// setSessionHook makes the keeper of r call fn once it has brought every
// owned node onto session id. With a nil t it lasts as long as r.
func setSessionHook(t testing.TB, r *Registry, fn func(id int64)) {
	hooks.mu.Lock()
	hooks.session[r] = fn
	hooks.mu.Unlock()
	if t == nil {
		return
	}
	t.Cleanup(func() {
		hooks.mu.Lock()
		delete(hooks.session, r)
		hooks.mu.Unlock()
	})
}

// setFetchHook makes each load of r's watchers call fn with the number of
// children whose data it reads, until t ends.
func setFetchHook(t testing.TB, r *Registry, fn func(n int)) {
	hooks.mu.Lock()
	hooks.fetch[r] = fn
	hooks.mu.Unlock()
	t.Cleanup(func() {
		hooks.mu.Lock()
		delete(hooks.fetch, r)
		hooks.mu.Unlock()
	})
}
