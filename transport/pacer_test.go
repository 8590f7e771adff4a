package transport

import (
	"context"
	"math"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// TestLargeInFlight: with the default bound beside small calls (one waits
// for its answer, or one was made since the previous large request), a
// second large request waits for the first's slot, and fails as not sent
// (nothing reaches the server) when its budget or context ends first;
// small calls never wait for it. With no small call made, or with no bound
// (negative), two are in flight at once.
func TestLargeInFlight(t *testing.T) {
	largeReq := func(name string, timeout time.Duration) *protocol.Message {
		req := newRequest(name + strings.Repeat("x", 2<<10))
		req.Timeout = timeout
		return req
	}
	call := func(ctx context.Context, p *Pool, addr string, req *protocol.Message, done chan<- error) {
		resp, err := p.RoundTrip(ctx, addr, req)
		p.Release(resp)
		done <- err
	}
	t.Run("bound of 1 beside a small call", func(t *testing.T) {
		bs := startBlockingServer(t, ServerConfig{})
		p := newPool(t, Config{LargeMessage: 1 << 10})
		ctx := testCtx(t)
		small := make(chan error, 2)
		go call(ctx, p, bs.addr, newRequest("small"), small)
		if got := waitFor(t, bs.entered, "the first small request's handler"); got != "small" {
			t.Fatalf("handler entered for %.10q, want the small request", got)
		}
		first := make(chan error, 1)
		go call(ctx, p, bs.addr, largeReq("first", 0), first)
		waitFor(t, bs.entered, "the first large request's handler")

		_, err := p.RoundTrip(ctx, bs.addr, largeReq("budget", 50*time.Millisecond))
		wantStatus(t, err, protocol.StatusClientTimeout, false, true)
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		_, err = p.RoundTrip(cctx, bs.addr, largeReq("ctx", 0))
		cancel()
		wantStatus(t, err, protocol.StatusClientTimeout, false, true)

		go call(ctx, p, bs.addr, newRequest("small"), small)
		if got := waitFor(t, bs.entered, "the second small request's handler"); got != "small" {
			t.Fatalf("handler entered for %.10q, want the small request (the waiting large ones must not be sent)", got)
		}
		close(bs.release)
		for range 2 {
			if err := waitFor(t, small, "a small call"); err != nil {
				t.Fatalf("small call: %v", err)
			}
		}
		if err := waitFor(t, first, "the first large call"); err != nil {
			t.Fatalf("first large call: %v", err)
		}
		resp, err := p.RoundTrip(ctx, bs.addr, largeReq("third", time.Second))
		if err != nil {
			t.Fatalf("a large call after the slot was freed: %v", err)
		}
		p.Release(resp)
		if got := waitFor(t, bs.entered, "the third large request's handler"); !strings.HasPrefix(got, "third") {
			t.Fatalf("handler entered for %.10q, want the third large request", got)
		}
		if n := bs.ran.Load(); n != 4 {
			t.Errorf("the server ran %d requests, want 4 (two small, first, third)", n)
		}
	})
	t.Run("bound of 1 after a small call", func(t *testing.T) {
		// Small calls are answered at once; large ones wait for release.
		release := make(chan struct{})
		entered := make(chan struct{}, 2)
		ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
			if !strings.HasPrefix(string(req.Payload), "small") {
				entered <- struct{}{}
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			resp.Payload = append(resp.Payload[:0], req.Payload...)
		}), ServerConfig{})
		p := newPool(t, Config{LargeMessage: 1 << 10})
		ctx := testCtx(t)
		first := make(chan error, 1)
		go call(ctx, p, ts.addr, largeReq("first", 0), first)
		waitFor(t, entered, "the first large request's handler")
		resp, err := p.RoundTrip(ctx, ts.addr, newRequest("small"))
		if err != nil {
			t.Fatalf("small call: %v", err)
		}
		p.Release(resp)
		// No small call waits for its answer now, but one was made since
		// the first large request went.
		_, err = p.RoundTrip(ctx, ts.addr, largeReq("second", 50*time.Millisecond))
		wantStatus(t, err, protocol.StatusClientTimeout, false, true)
		close(release)
		if err := waitFor(t, first, "the first large call"); err != nil {
			t.Fatalf("first large call: %v", err)
		}
		select {
		case <-entered:
			t.Fatal("the server ran the second large request: it was sent without a slot")
		default:
		}
	})
	for _, tc := range []struct {
		name  string
		bound int
	}{
		{"no small call in flight", 0},
		{"no bound", -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bs := startBlockingServer(t, ServerConfig{})
			p := newPool(t, Config{LargeMessage: 1 << 10, LargeInFlight: tc.bound})
			ctx := testCtx(t)
			done := make(chan error, 2)
			for _, name := range []string{"a", "b"} {
				go call(ctx, p, bs.addr, largeReq(name, 0), done)
			}
			waitFor(t, bs.entered, "one large request's handler")
			waitFor(t, bs.entered, "the other large request's handler, in flight at once")
			close(bs.release)
			for range 2 {
				if err := waitFor(t, done, "a large call"); err != nil {
					t.Fatalf("large call: %v", err)
				}
			}
		})
	}
}

// TestPacerGivesUp: acquire gives up, on a full endpoint or in the pause between large
// requests, with the reason: the budget, the caller's context, or the
// pool's Close, each as not sent, and holds no slot afterwards.
func TestPacerGivesUp(t *testing.T) {
	for _, wait := range []string{"slot", "pause"} {
		for _, tc := range []struct {
			name   string
			budget time.Duration
			ctx    func() (context.Context, context.CancelFunc)
			close  bool
			status protocol.Status
		}{
			{"budget", 20 * time.Millisecond, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, false, protocol.StatusClientTimeout},
			{"context", 0, func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 20*time.Millisecond)
			}, false, protocol.StatusClientTimeout},
			{"pool closed", 0, func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, true, protocol.StatusChannelInactive},
		} {
			t.Run(wait+"/"+tc.name, func(t *testing.T) {
				p := NewPool(Config{Logger: quietLogger()})
				defer p.Close()
				e, err := p.endpoint("127.0.0.1:1")
				if err != nil {
					t.Fatal(err)
				}
				// A small call is waiting for its answer: large
				// requests are bounded and paced.
				e.slots[0].Store(&clientConn{pending: map[uint64]*call{1: {}}})
				want := 0
				if wait == "slot" {
					e.pace.slots <- struct{}{} // the only slot is taken
					want = 1
				} else {
					// The previous large request asked for a long pause.
					e.pace.next.Store(e.pace.clock() + int64(time.Hour))
				}
				ctx, cancel := tc.ctx()
				defer cancel()
				if tc.close {
					_ = p.Close()
				}
				_, err = e.pace.acquire(ctx, time.Now(), tc.budget)
				wantStatus(t, err, tc.status, false, true)
				if len(e.pace.slots) != want {
					t.Errorf("%d slots taken after a call gave up, want %d", len(e.pace.slots), want)
				}
			})
		}
	}
}

// TestLargeShare: while a small call to the address is in flight, a large
// request starts no sooner than the previous one's round trip times
// (1−LargeShare)/LargeShare after it ended, at most maxLargePause, and a
// budget shorter than that pause fails the call as not sent; with no small
// call in flight, or with pacing off, the next large request goes at once.
func TestLargeShare(t *testing.T) {
	type visit struct{ in, out time.Time }
	for _, tc := range []struct {
		name           string
		share          float64
		hold           time.Duration // each large request's handler time
		smallPinned    bool
		minGap, maxGap time.Duration // between the first's handler end and the second's start; 0: unchecked
	}{
		// The client's round trip d >= hold, and the second request leaves
		// d·(1−0.5)/0.5 >= hold after the first's response arrived, which
		// is after the handler returned.
		{"small call in flight", 0.5, 60 * time.Millisecond, true, 60 * time.Millisecond, 0},
		{"no small call in flight", 0.5, 60 * time.Millisecond, false, 0, 60 * time.Millisecond},
		{"pacing off", 1, 60 * time.Millisecond, true, 0, 60 * time.Millisecond},
		// Unbounded, the pause would be 3·d >= 450ms.
		{"pause bounded", 0.25, 150 * time.Millisecond, true, maxLargePause, 3 * maxLargePause},
	} {
		t.Run(tc.name, func(t *testing.T) {
			release := make(chan struct{})
			smallIn := make(chan struct{}, 1)
			visits := make(chan visit, 10)
			ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
				if string(req.Payload) == "small" {
					smallIn <- struct{}{}
					select {
					case <-release:
					case <-ctx.Done():
					}
				} else {
					in := time.Now()
					time.Sleep(tc.hold) // the work that makes the round trip last
					visits <- visit{in, time.Now()}
				}
				resp.Payload = append(resp.Payload[:0], req.Payload...)
			}), ServerConfig{})
			p := newPool(t, Config{LargeMessage: 1 << 10, LargeShare: tc.share})
			ctx := testCtx(t)
			small := make(chan error, 1)
			if tc.smallPinned {
				go func() {
					resp, err := p.RoundTrip(ctx, ts.addr, newRequest("small"))
					p.Release(resp)
					small <- err
				}()
				waitFor(t, smallIn, "the small request's handler")
			}
			large := func(timeout time.Duration) error {
				req := newRequest(strings.Repeat("x", 2<<10))
				req.Timeout = timeout
				resp, err := p.RoundTrip(ctx, ts.addr, req)
				p.Release(resp)
				return err
			}
			if err := large(0); err != nil {
				t.Fatalf("first large call: %v", err)
			}
			first := waitFor(t, visits, "the first large request's visit")
			if tc.minGap > 0 {
				// The pause is at least minGap long: a budget of 10ms ends in it.
				wantStatus(t, large(10*time.Millisecond), protocol.StatusClientTimeout, false, true)
			}
			if err := large(0); err != nil {
				t.Fatalf("second large call: %v", err)
			}
			second := waitFor(t, visits, "the second large request's visit")
			select {
			case v := <-visits:
				t.Fatalf("the server ran a third large request (at %v): the one whose budget ended in the pause was sent", v.in.Sub(first.in))
			default:
			}
			gap := second.in.Sub(first.out)
			if tc.minGap > 0 && gap < tc.minGap {
				t.Errorf("second large request arrived %v after the first's handler returned, want >= %v", gap, tc.minGap)
			}
			if tc.maxGap > 0 && gap >= tc.maxGap {
				t.Errorf("second large request arrived %v after the first's handler returned, want < %v", gap, tc.maxGap)
			}
			close(release)
			if tc.smallPinned {
				if err := waitFor(t, small, "the small call"); err != nil {
					t.Fatalf("small call: %v", err)
				}
			}
		})
	}
}

// TestPacingKeepsLargeRequestsToTheirShare guards the pacing: while small
// calls wait for answers, large requests take at most LargeShare of the
// time, so a small call rarely finds one in its way. It drives the pacer
// with a clock of its own: no timers, no wall-clock time.
func TestPacingKeepsLargeRequestsToTheirShare(t *testing.T) {
	const rounds, d = 100, int64(10 * time.Millisecond) // each large round trip
	// busyShare returns the share of the time large requests were in
	// flight, when each goes as soon as p lets it.
	busyShare := func(p *pacer) float64 {
		var now int64
		for range rounds {
			if wait := p.pauseAt(now); wait > 0 {
				now += int64(wait)
			}
			sent := now
			now += d
			p.done(sent, now)
		}
		return float64(rounds*d) / float64(now)
	}
	const share = 0.25
	paced := newPacer(&Config{LargeMessage: 1, LargeInFlight: -1, LargeShare: share}, "a", func() bool { return true }, func() uint32 { return 0 }, nil)
	if paced == nil || paced.getShare() != share || paced.adaptive {
		t.Fatalf("newPacer made %+v for LargeShare %v", paced, share)
	}
	with, without := busyShare(paced), busyShare(&pacer{})
	if without < 0.99 {
		t.Fatalf("without pacing, large requests were in flight %.2f of the time, want all of it", without)
	}
	if with > share+0.01 {
		t.Errorf("with pacing, large requests were in flight %.2f of the time while small calls waited, want at most LargeShare (%.2f): "+
			"the pause is what keeps small calls' tail latency near its value next to large calls (docs/performance.md, finding 5)", with, share)
	}
}

// TestAdaptiveShare drives an adaptive pacer's windows by hand: the share
// narrows while the small calls' p99 is over LargeSlowdown times their p99
// with no large request in flight, or when none went without one; it
// widens, up to no pacing, while that p99 is well under the target; in
// between it stays.
func TestAdaptiveShare(t *testing.T) {
	p := newPacer(&Config{LargeMessage: 1, LargeInFlight: 1, LargeSlowdown: 2.5}, "a", func() bool { return true }, func() uint32 { return 0 }, nil)
	if p == nil || !p.adaptive || p.getShare() != initialShare {
		t.Fatalf("newPacer made %+v for LargeShare 0, want an adaptive share from %v", p, initialShare)
	}
	const us = int64(time.Microsecond)
	// window books one window: clean calls of cleanRTT, and the rest,
	// 5 % of the window, of dirtyRTT (so the p99 of all is dirtyRTT).
	window := func(clean int, cleanRTT, dirtyRTT int64) {
		for i := range latWindow {
			if i < clean {
				p.smallDone(cleanRTT, true)
			} else {
				p.smallDone(dirtyRTT, false)
			}
		}
	}
	before := p.getShare()
	window(latWindow*95/100, 100*us, 1000*us) // 10× the clean p99
	if got, want := p.getShare(), before*0.8; math.Abs(got-want) > 1e-9 {
		t.Fatalf("after a window at 10× the clean p99, share %v, want %v", got, want)
	}
	for range 100 {
		window(0, 0, 100*us) // no call without a large one in flight
	}
	if got := p.getShare(); got != minShare {
		t.Fatalf("after windows with no clean call, share %v, want the floor %v", got, minShare)
	}
	before = p.getShare()
	window(latWindow*95/100, 100*us, 220*us) // 2.2×: within [0.75, 1] of 2.5×
	if got := p.getShare(); got != before {
		t.Fatalf("after a window at 2.2× the clean p99 (target 2.5×), share moved %v → %v", before, got)
	}
	for range 100 {
		window(latWindow*95/100, 100*us, 120*us)
	}
	if got := p.getShare(); got != maxShare {
		t.Fatalf("after windows at 1.2× the clean p99, share %v, want %v", got, maxShare)
	}
	// At a share of 1 there is no pause.
	p.done(0, int64(time.Millisecond))
	if pause := p.pauseAt(int64(time.Millisecond)); pause > 0 {
		t.Errorf("a share of 1 left a pause of %v", pause)
	}
	if fixed := newPacer(&Config{LargeMessage: 1, LargeInFlight: 1, LargeShare: 0.5}, "a", func() bool { return true }, func() uint32 { return 0 }, nil); fixed.adaptive {
		t.Errorf("LargeShare 0.5 made an adaptive pacer")
	}
}

// TestPoolAdaptsShare: a pool on its defaults times its small calls once a
// large request has gone, not before. With no large request in flight they
// all count as clean, and the share widens; while a large request is in
// flight none does, and it narrows.
func TestPoolAdaptsShare(t *testing.T) {
	release, entered := make(chan struct{}), make(chan struct{}, 1)
	var hold atomic.Bool // large requests wait for release
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		if len(req.Payload) >= 1<<10 && hold.Load() {
			entered <- struct{}{}
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		resp.Payload = append(resp.Payload[:0], req.Payload[:min(len(req.Payload), 8)]...)
	}), ServerConfig{})
	p := newPool(t, Config{LargeMessage: 1 << 10})
	ctx := testCtx(t)
	call := func() {
		t.Helper()
		resp, err := p.RoundTrip(ctx, ts.addr, newRequest("small"))
		if err != nil {
			t.Fatalf("small call: %v", err)
		}
		p.Release(resp)
	}
	call()
	pace := (*p.eps.Load())[ts.addr].pace
	if pace == nil || !pace.adaptive {
		t.Fatalf("the default pool's pacer is %+v, want an adaptive one", pace)
	}
	for range 4 * sampleEvery {
		call()
	}
	if n := pace.lat.count.Load(); n != 0 {
		t.Fatalf("%d small calls timed before any large request", n)
	}
	resp, err := p.RoundTrip(ctx, ts.addr, newRequest(strings.Repeat("x", 2<<10)))
	if err != nil {
		t.Fatalf("first large call: %v", err)
	}
	p.Release(resp)
	hold.Store(true)
	// Calls until the share has moved, at most a few windows' worth.
	const most = 4 * latWindow * sampleEvery
	until := func(what string, moved func(float64) bool) {
		t.Helper()
		for range most {
			if moved(pace.getShare()) {
				return
			}
			call()
		}
		t.Fatalf("after %d small calls the share is %v, want it %s", most, pace.getShare(), what)
	}
	until("above 0.25 with no large request in flight", func(s float64) bool { return s > initialShare })
	widened := pace.getShare()

	large := make(chan error, 1)
	go func() {
		resp, err := p.RoundTrip(ctx, ts.addr, newRequest(strings.Repeat("x", 2<<10)))
		p.Release(resp)
		large <- err
	}()
	select {
	case <-entered:
	case err := <-large:
		t.Fatalf("the large call ended before its handler ran: %v", err)
	case <-ctx.Done():
		t.Fatalf("the large request's handler did not run: %v", ctx.Err())
	}
	if pace.active.Load() != 1 {
		t.Fatalf("%d large requests in flight, want 1", pace.active.Load())
	}
	until("below its widened "+strconv.FormatFloat(widened, 'g', 3, 64)+" while a large request is in flight",
		func(s float64) bool { return s < widened })
	close(release)
	if err := waitFor(t, large, "the large call"); err != nil {
		t.Fatalf("large call: %v", err)
	}
}

// TestTimedSmallCallsAllocateNothing: timing small calls for an adaptive
// share adds no allocation to a call: a pool with a fixed share, which
// times none, allocates as much per call.
func TestTimedSmallCallsAllocateNothing(t *testing.T) {
	ts := startServer(t, echo, ServerConfig{})
	ctx := testCtx(t)
	perCall := func(cfg Config) float64 {
		p := newPool(t, cfg)
		// One large request first: small calls are timed only after one.
		large := newRequest("large")
		large.Payload = make([]byte, 64<<10) // the default LargeMessage
		resp, err := p.RoundTrip(ctx, ts.addr, large)
		if err != nil {
			t.Fatalf("large call: %v", err)
		}
		p.Release(resp)
		req := newRequest("small")
		call := func() {
			resp, err := p.RoundTrip(ctx, ts.addr, req)
			if err != nil {
				t.Fatalf("small call: %v", err)
			}
			p.Release(resp)
		}
		call()
		return testing.AllocsPerRun(2000, call)
	}
	adaptive := perCall(Config{})
	fixed := perCall(Config{LargeShare: 0.25})
	t.Logf("allocations per small call: %.2f with an adaptive share, %.2f with a fixed one", adaptive, fixed)
	if adaptive > fixed+0.05 {
		t.Errorf("a small call allocates %.2f times with an adaptive share, %.2f with a fixed one: timing must not allocate", adaptive, fixed)
	}
}
