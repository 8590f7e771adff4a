// Shared: one server process for a whole test binary, started on first use.

package proctest

import (
	"errors"
	"sync"
)

// errSharedNil reports a start function that returned neither a server nor
// an error.
var errSharedNil = errors.New("proctest: shared server: start returned no server")

// Runner is what a TestMain runs: *testing.M, or the wrapper [Shared.Wrap]
// returns.
type Runner interface{ Run() int }

// Shared holds a test package's shared server, of type *S, started by the
// first test that asks. The zero value is ready to use.
type Shared[S any] struct {
	mu  sync.Mutex // guards following
	srv *S
	err error
}

// Get returns the shared server, calling start to start it on first use.
// start must leave nothing running when it fails; its error is kept and
// returned to every later caller, so a broken server is started once.
func (sh *Shared[S]) Get(start func() (*S, error)) (*S, error) {
	sh.mu.Lock()
	defer sh.mu.Unlock()
	if sh.srv == nil && sh.err == nil {
		sh.srv, sh.err = start()
		if sh.err == nil && sh.srv == nil {
			sh.err = errSharedNil
		}
		if sh.err != nil {
			sh.srv = nil
		}
	}
	return sh.srv, sh.err
}

// Wrap returns a Runner that runs m and then, before returning its code,
// calls destroy on the shared server if one was started, so that leak
// checks wrapped around it find the server gone.
func (sh *Shared[S]) Wrap(m Runner, destroy func(*S)) Runner {
	return runFunc(func() int {
		code := m.Run()
		sh.mu.Lock()
		defer sh.mu.Unlock()
		if sh.srv != nil {
			destroy(sh.srv)
			sh.srv = nil
		}
		return code
	})
}

type runFunc func() int

func (f runFunc) Run() int { return f() }
