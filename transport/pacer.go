// The scheduler of one address's large requests next to small calls: a bound on those in flight, and pacing.

package transport

import (
	"context"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// pacer schedules the large requests (Config.LargeMessage) to one address.
// Beside small calls it bounds how many are in flight
// (Config.LargeInFlight). While small calls wait for answers, it spaces
// them (Config.LargeShare).
// With an adaptive share it times some small calls and moves the share so
// that their p99 stays near Config.LargeSlowdown times what it is with no
// large request in flight (adapt).
type pacer struct {
	slots  chan struct{}   // LargeInFlight slots; nil: no bound
	share  atomic.Uint64   // the share of time, float64 bits; 0 or 1: no pacing
	busy   func() bool     // reports whether small calls wait for answers
	made   func() uint32   // counts the small calls made, wrapping
	seen   atomic.Uint32   // made at the last large request's acquire
	closed <-chan struct{} // closed by the pool's Close
	addr   string          // for error messages
	epoch  time.Time       // the zero of clock
	next   atomic.Int64    // no large request before this (clock) while busy

	// adaptive: the share follows the small calls' latency. Then
	// slowdown is the p99 ratio it aims at.
	adaptive bool
	slowdown float64
	// started counts the large requests sent, active those in flight.
	// A small call that saw none active at its start and end, and the
	// same started, overlapped none.
	started atomic.Uint64
	active  atomic.Int32
	lat     latencies // the timed small calls since the last adjustment
}

// Bounds of an adaptive share. At minShare a large request still goes
// about every maxLargePause.
const (
	minShare = 0.05
	maxShare = 1.0
)

// sampleEvery: an adaptive pacer times one small call in sampleEvery.
const sampleEvery = 2

// maxLargePause bounds the pause after one large request.
const maxLargePause = 100 * time.Millisecond

// newPacer returns the pacer of addr for cfg, or nil when large requests
// are neither bounded nor paced.
func newPacer(cfg *Config, addr string, busy func() bool, made func() uint32, closed <-chan struct{}) *pacer {
	if cfg.LargeMessage <= 0 {
		return nil
	}
	p := &pacer{busy: busy, made: made, closed: closed, addr: addr, epoch: time.Now()}
	if cfg.LargeInFlight > 0 {
		p.slots = make(chan struct{}, cfg.LargeInFlight)
	}
	switch s := cfg.LargeShare; {
	case s == 0:
		p.adaptive, p.slowdown = true, cfg.LargeSlowdown
		p.setShare(initialShare)
	case s > 0 && s < 1:
		p.setShare(s)
	}
	if p.slots == nil && p.getShare() == 0 {
		return nil
	}
	return p
}

// initialShare is where an adaptive share starts.
const initialShare = 0.25

func (p *pacer) getShare() float64  { return math.Float64frombits(p.share.Load()) }
func (p *pacer) setShare(s float64) { p.share.Store(math.Float64bits(s)) }

// clock reads the monotonic clock, in nanoseconds since the pacer was made.
func (p *pacer) clock() int64 { return int64(time.Since(p.epoch)) }

// largeTurn is one large request let go by acquire: when it went (clock)
// and whether it holds a slot.
type largeTurn struct {
	sent int64
	slot bool
}

// acquire lets one large request go. It takes a free slot if there is
// one. With none free it waits for one beside small calls: some wait for
// answers, or some were made since the previous large request. Otherwise
// it goes without one. Then, if small calls are busy, it waits out the
// pause that the previous large request left. Both waits end at what is
// left of budget (counted from start; zero: no budget), at ctx's end, or
// at the pool's Close, as not sent. On success the caller owes release the
// turn it returns.
func (p *pacer) acquire(ctx context.Context, start time.Time, budget time.Duration) (largeTurn, error) {
	var w largeWait
	defer w.stop()
	var t largeTurn
	n := p.made()
	beside := p.seen.Swap(n) != n
	if p.slots != nil {
		select {
		case p.slots <- struct{}{}:
			t.slot = true
		default:
			// Alone on the address, large requests go at full rate. Those
			// in flight without a slot when small calls begin finish
			// within one round trip.
			if beside || p.busy() {
				if err := w.wait(ctx, p, start, budget, p.slots, "waiting for a large-request slot to "); err != nil {
					return largeTurn{}, err
				}
				t.slot = true
			}
		}
	}
	if pause := p.pauseAt(p.clock()); pause > 0 && p.busy() {
		w.pause = time.NewTimer(pause)
		if err := w.wait(ctx, p, start, budget, nil, "in the pause between large requests to "); err != nil {
			if t.slot {
				<-p.slots
			}
			return largeTurn{}, err
		}
	}
	p.started.Add(1)
	p.active.Add(1)
	t.sent = p.clock()
	return t, nil
}

// pauseAt returns how long a large request must wait at now (clock) while
// small calls are busy.
func (p *pacer) pauseAt(now int64) time.Duration {
	if p.getShare() == 0 {
		return 0
	}
	return time.Duration(p.next.Load() - now)
}

// release ends a large request that acquire let go, and gives its slot
// back.
func (p *pacer) release(t largeTurn) {
	p.active.Add(-1)
	p.done(t.sent, p.clock())
	if t.slot {
		<-p.slots
	}
}

// done books a large request that went at sent and ended at now (clock).
// The next may go once the pause, share-to-rest of its round trip, is over.
func (p *pacer) done(sent, now int64) {
	share := p.getShare()
	if share == 0 || share >= 1 {
		return
	}
	d := now - sent
	// One that waited long for a slow server must not hold the next ones
	// back several times as long: the pause is bounded.
	next := now + min(int64(float64(d)*(1-share)/share), int64(maxLargePause))
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

// timeSmall makes a small call's round trip over c and books its time.
// Once a window is full it adjusts the share (adapt). A call that failed
// is not booked.
func (p *pacer) timeSmall(ctx context.Context, c *clientConn, req *protocol.Message, start time.Time) (*protocol.Message, error) {
	t0, started, active := p.clock(), p.started.Load(), p.active.Load()
	resp, err := c.roundTrip(ctx, req, start)
	if err == nil {
		clean := active == 0 && p.active.Load() == 0 && p.started.Load() == started
		p.smallDone(p.clock()-t0, clean)
	}
	return resp, err
}

// smallDone books a small call of rtt nanoseconds; clean: it overlapped
// no large request.
func (p *pacer) smallDone(rtt int64, clean bool) {
	if p.lat.add(rtt, clean) {
		p.adapt()
	}
}

// adapt moves the share from a full window of timed small calls. Their
// p99 is compared with the p99 of those that overlapped no large request.
// Over slowdown times it, the share narrows by a fifth; under three
// quarters of that, it widens by 15 %, up to no pacing at all. A
// window with too few calls that overlapped none narrows it too: then
// large requests leave no time without them.
func (p *pacer) adapt() {
	if !p.lat.mu.TryLock() {
		return // another goroutine adjusts this window
	}
	defer p.lat.mu.Unlock()
	all, clean, ok := p.lat.take()
	if !ok {
		return
	}
	share := p.getShare()
	switch {
	case clean == 0 || float64(all) > p.slowdown*float64(clean):
		share = max(minShare, share*0.8)
	case float64(all) < 0.75*p.slowdown*float64(clean):
		share = min(maxShare, share*1.15)
	default:
		return
	}
	p.setShare(share)
}

// latencies holds a window of timed small calls in two histograms: all of
// them, and those that overlapped no large request. Buckets are a quarter
// of an octave wide, from 1 µs.
type latencies struct {
	mu    sync.Mutex // held by the goroutine that ends a window
	count atomic.Int32
	all   [latBuckets]atomic.Int32
	clean [latBuckets]atomic.Int32
}

const (
	latBuckets = 80             // up to 2^20 µs, about a second
	latWindow  = 1024           // timed calls per window
	minClean   = latWindow / 16 // fewer clean ones than this: no clean p99
)

// latBucket returns the bucket of d nanoseconds.
func latBucket(d int64) int {
	us := float64(d) / 1e3
	if us <= 1 {
		return 0
	}
	return min(latBuckets-1, int(4*math.Log2(us)))
}

// bucketTime returns the upper bound of bucket i, in nanoseconds.
func bucketTime(i int) int64 { return int64(1e3 * math.Exp2(float64(i+1)/4)) }

// add books one call; it reports whether the window is full.
func (l *latencies) add(d int64, clean bool) bool {
	b := latBucket(d)
	l.all[b].Add(1)
	if clean {
		l.clean[b].Add(1)
	}
	return l.count.Add(1) >= latWindow
}

// take returns the window's p99 of all calls and of the clean ones (zero
// with fewer than minClean), in nanoseconds, and empties it. ok is false
// when the window is not full (another goroutine took it).
func (l *latencies) take() (all, clean int64, ok bool) {
	if l.count.Load() < latWindow {
		return 0, 0, false
	}
	var a, c [latBuckets]int32
	var na, nc int32
	for i := range latBuckets {
		a[i], c[i] = l.all[i].Swap(0), l.clean[i].Swap(0)
		na += a[i]
		nc += c[i]
	}
	l.count.Store(0)
	all = p99(a[:], na)
	if nc >= minClean {
		clean = p99(c[:], nc)
	}
	return all, clean, true
}

// p99 returns the upper bound of the bucket that holds the 99th
// percentile of h, which counts n calls.
func p99(h []int32, n int32) int64 {
	rank := n - n/100
	var seen int32
	for i, k := range h {
		seen += k
		if seen >= rank {
			return bucketTime(i)
		}
	}
	return bucketTime(len(h) - 1)
}
