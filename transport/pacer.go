// The scheduler of one address's large requests: a bound on those in flight, and pacing next to small calls.

package transport

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// pacer schedules the large requests (Config.LargeMessage) to one address.
// It bounds how many are in flight (Config.LargeInFlight).
// While small calls wait for answers, it spaces them (Config.LargeShare).
type pacer struct {
	slots  chan struct{}   // LargeInFlight slots; nil: no bound
	share  float64         // Config.LargeShare; 0: no pacing
	busy   func() bool     // reports whether small calls wait for answers
	closed <-chan struct{} // closed by the pool's Close
	addr   string          // for error messages
	epoch  time.Time       // the zero of clock
	next   atomic.Int64    // no large request before this (clock) while busy
}

// maxLargePause bounds the pause after one large request.
const maxLargePause = 100 * time.Millisecond

// newPacer returns the pacer of addr for cfg, or nil when large requests
// are neither bounded nor paced.
func newPacer(cfg *Config, addr string, busy func() bool, closed <-chan struct{}) *pacer {
	if cfg.LargeMessage <= 0 {
		return nil
	}
	p := &pacer{busy: busy, closed: closed, addr: addr, epoch: time.Now()}
	if cfg.LargeInFlight > 0 {
		p.slots = make(chan struct{}, cfg.LargeInFlight)
	}
	if s := cfg.LargeShare; s > 0 && s < 1 {
		p.share = s
	}
	if p.slots == nil && p.share == 0 {
		return nil
	}
	return p
}

// clock reads the monotonic clock, in nanoseconds since the pacer was made.
func (p *pacer) clock() int64 { return int64(time.Since(p.epoch)) }

// acquire lets one large request go. It takes a slot, then waits out the
// pause that the previous large request left, if small calls are busy.
// Both waits end at what is left of budget (counted from start; zero: no
// budget), at ctx's end, or at the pool's Close, as not sent. On success
// it returns when the request went (clock), which the caller owes release.
func (p *pacer) acquire(ctx context.Context, start time.Time, budget time.Duration) (int64, error) {
	var w largeWait
	defer w.stop()
	if p.slots != nil {
		select {
		case p.slots <- struct{}{}:
		default:
			if err := w.wait(ctx, p, start, budget, p.slots, "waiting for a large-request slot to "); err != nil {
				return 0, err
			}
		}
	}
	if pause := p.pauseAt(p.clock()); pause > 0 && p.busy() {
		w.pause = time.NewTimer(pause)
		if err := w.wait(ctx, p, start, budget, nil, "in the pause between large requests to "); err != nil {
			if p.slots != nil {
				<-p.slots
			}
			return 0, err
		}
	}
	return p.clock(), nil
}

// pauseAt returns how long a large request must wait at now (clock) while
// small calls are busy.
func (p *pacer) pauseAt(now int64) time.Duration {
	if p.share == 0 {
		return 0
	}
	return time.Duration(p.next.Load() - now)
}

// release ends a large request that acquire let go at sent, and gives its
// slot back.
func (p *pacer) release(sent int64) {
	p.done(sent, p.clock())
	if p.slots != nil {
		<-p.slots
	}
}

// done books a large request that went at sent and ended at now (clock).
// The next may go once the pause, share-to-rest of its round trip, is over.
func (p *pacer) done(sent, now int64) {
	if p.share == 0 {
		return
	}
	d := now - sent
	// One that waited long for a slow server must not hold the next ones
	// back several times as long: the pause is bounded.
	next := now + min(int64(float64(d)*(1-p.share)/p.share), int64(maxLargePause))
	for {
		old := p.next.Load()
		if old >= next || p.next.CompareAndSwap(old, next) {
			return
		}
	}
}

// largeWait is acquire's timers: the budget's, made on the first wait, and
// the pause's.
type largeWait struct {
	budget, pause *time.Timer
}

// wait sends on slot (nil: waits for the pause timer instead) unless the
// budget, ctx or the pool's Close comes first.
func (w *largeWait) wait(ctx context.Context, p *pacer, start time.Time, budget time.Duration, slot chan struct{}, what string) error {
	if w.budget == nil && budget > 0 {
		w.budget = time.NewTimer(budget - time.Since(start))
	}
	var timeout, paused <-chan time.Time
	if w.budget != nil {
		timeout = w.budget.C
	}
	if w.pause != nil {
		paused = w.pause.C
	}
	select {
	case slot <- struct{}{}:
		return nil
	case <-paused:
		return nil
	case <-ctx.Done():
		return protocol.ContextError(ctx.Err(), false)
	case <-timeout:
		return protocol.NotSent(protocol.StatusClientTimeout, "timeout budget spent "+what+p.addr, nil)
	case <-p.closed:
		return errPoolClosed
	}
}

func (w *largeWait) stop() {
	if w.budget != nil {
		w.budget.Stop()
	}
	if w.pause != nil {
		w.pause.Stop()
	}
}
