package main

import (
	"errors"
	"fmt"
	"time"
)

// errStalled reports a window in which no call completed for stallLimit:
// a lost reply, or a client or server that hangs. The peers' calls carry
// no deadline (the workload is the frameworks' defaults), so without the
// watch such a window would wait for its calls forever.
var errStalled = errors.New("dabbbench: no call completed")

// stallLimit is how long a window may go without any call completing,
// failed or not, before it is reported as stalled. A variable for tests.
var stallLimit = 30 * time.Second

// stallWatch watches the calls of one window: the window waits through
// sleep and wait, which return errStalled once the count of completed
// calls, failed or not, has not moved for limit.
type stallWatch struct {
	calls func() uint64 // calls completed so far; read on each check

	limit time.Duration
	seen  uint64    // calls at the last check
	since time.Time // when calls last moved (or the watch began)
}

// newStallWatch returns a watch of the count calls returns, read about
// ten times per limit (at most once a second).
func newStallWatch(limit time.Duration, calls func() uint64) *stallWatch {
	return &stallWatch{calls: calls, limit: limit, since: time.Now(), seen: calls()}
}

// sleep waits for d, or until the calls stall; what names the phase in
// the error.
func (s *stallWatch) sleep(d time.Duration, what string) error {
	done := make(chan struct{})
	t := time.AfterFunc(d, func() { close(done) })
	defer t.Stop()
	return s.wait(done, what)
}

// wait waits until done is closed, or until the calls stall.
func (s *stallWatch) wait(done <-chan struct{}, what string) error {
	period := min(max(s.limit/10, time.Millisecond), time.Second)
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		select {
		case <-done:
			return nil
		case now := <-tick.C:
			if n := s.calls(); n != s.seen {
				s.seen, s.since = n, now
				continue
			}
			if now.Sub(s.since) >= s.limit {
				return fmt.Errorf("%w for %v %s (a reply lost, or a hung client or server?)", errStalled, s.limit, what)
			}
		}
	}
}
