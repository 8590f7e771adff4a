package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
	"github.com/dabbrpc/dabb/bench/hist"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// point is one measured window: one framework at one point of the sweep
// in one round.
type point struct {
	Framework string
	Round     int    // from 1
	Median    bool   // the round reported for this framework and point
	Payload   string // small, 16k, 1m
	C         int    // goroutines making calls of Payload
	Large     int    // goroutines making 1 MiB calls alongside (the -mix point)
	Calls     uint64 // calls of Payload completed in the window
	Errors    uint64
	FirstErr  string
	Window    time.Duration
	P50       time.Duration
	P99       time.Duration
	P999      time.Duration
	Max       time.Duration
	ClientCPU time.Duration
	ServerCPU time.Duration
	Client    sample // what the client process used in the window
	Server    sample // what the server process used in the window
	LargeP99  time.Duration
	LargeN    uint64
}

// rate returns calls per second.
func (p point) rate() float64 {
	if p.Window <= 0 {
		return 0
	}
	return float64(p.Calls) / p.Window.Seconds()
}

// allCalls returns every call completed in the window: the calls of
// Payload and, at the -mix point, the 1 MiB ones. The CPU and system calls
// of a window are the whole processes', so the per-call figures divide
// them by all calls, never by the small calls alone.
func (p point) allCalls() uint64 { return p.Calls + p.LargeN }

// per100k returns CPU seconds per 100k calls of cpu over all the point's
// calls (allCalls).
func (p point) per100k(cpu time.Duration) float64 {
	if p.allCalls() == 0 {
		return 0
	}
	return cpu.Seconds() / float64(p.allCalls()) * 1e5
}

// syscallsPerCall returns the read and write system calls per call (of
// allCalls), client and server together.
func (p point) syscallsPerCall() (reads, writes float64) {
	if p.allCalls() == 0 {
		return 0, 0
	}
	n := float64(p.allCalls())
	return float64(p.Client.sysr+p.Server.sysr) / n, float64(p.Client.sysw+p.Server.sysw) / n
}

// usPerCall returns client plus server CPU microseconds per call (of
// allCalls).
func (p point) usPerCall() float64 {
	if p.allCalls() == 0 {
		return 0
	}
	return float64((p.ClientCPU + p.ServerCPU).Microseconds()) / float64(p.allCalls())
}

// results is the whole run.
type results struct {
	cfg      config
	start    time.Time
	end      time.Time
	loadFrom string
	loadTo   string
	points   []point       // every window of every round, in the order measured
	skipped  []string      // frameworks that failed, with why and from when
	allocs   *allocResults // the in-process benchmarks, nil without -allocs
	scale    *scaleResults // the scale section, nil without -scale
}

func run(cfg config, stdout, stderr io.Writer) error {
	res := &results{cfg: cfg, start: time.Now(), loadFrom: loadAvg()}
	prog := newProgress(stderr, cfg)
	defer prog.stop()
	if !cfg.sweep {
		res.scale = runScale(cfg.scaleCfg, prog, prog.wrap(stderr))
		res.end, res.loadTo = time.Now(), loadAvg()
		prog.stop()
		return writeScaleOnly(res, stdout)
	}
	stopProfile := func() {}
	if cfg.profile != "" {
		stop, err := startProfile(filepath.Join(cfg.profile, clientProfile(cfg)))
		if err != nil {
			return err
		}
		stopProfile = sync.OnceFunc(stop)
		defer stopProfile()
	}
	defer programs.removeAll()
	var ents []*entrant
	defer func() {
		for _, e := range ents {
			if e.stalled {
				e.closeWithin(10 * time.Second) // its client may hang in Close too
				continue
			}
			e.close()
		}
	}()
	for _, f := range cfg.frameworks {
		e, err := startEntrant(f, cfg, prog.wrap(stderr))
		if err != nil {
			prog.logf("%s: not measured: %v", f.Name, err)
			res.skipped = append(res.skipped, fmt.Sprintf("%s: not measured: %v", f.Name, err))
			prog.drop(cfg.windowsLeft(0, -1))
			continue
		}
		ents = append(ents, e)
	}
	var err error
	res.points, err = sweep(ents, cfg, prog, func(e *entrant, w window) (point, error) {
		if d := settle(ents); d >= settleMax {
			prog.logf("the processes were not quiet after %v; measuring %s anyway", d, e.f.Name)
		} else if d > 3*settleProbe {
			prog.logf("waited %v for the processes to be quiet before %s", round(d), e.f.Name)
		}
		return measureEntrant(e, w)
	})
	if err != nil {
		return fmt.Errorf("%w; the run stops, no results written", err)
	}
	for _, e := range ents {
		e.close() // before the allocation benchmarks, which want the CPUs
		if e.err != nil {
			res.skipped = append(res.skipped, fmt.Sprintf("%s: %v", e.f.Name, e.err))
		}
	}
	stopProfile()
	selectMedians(res.points)
	// The sweep's header (duration, load averages) describes the sweep
	// alone; the allocation benchmarks run after it, in their own process.
	res.end = time.Now()
	res.loadTo = loadAvg()
	if cfg.allocs {
		prog.beginTail("allocations", "in-process benchmarks")
		res.allocs = measureAllocs(context.Background(), cfg.inProcessNames())
		prog.end()
		if res.allocs.err != nil {
			prog.logf("%v", res.allocs.err)
		}
	}
	if cfg.scale {
		res.scale = runScale(cfg.scaleCfg, prog, prog.wrap(stderr))
	}
	prog.stop()
	return writeResults(res, stdout)
}

// clientProfile returns the name of the client process's CPU profile:
// the client runs every framework's client, interleaved, so its profile
// is all-client.pprof, or <framework>-client.pprof when there is one.
func clientProfile(cfg config) string {
	if len(cfg.frameworks) == 1 {
		return cfg.frameworks[0].Name + "-client.pprof"
	}
	return "all-client.pprof"
}

// entrant is a framework in the sweep: its server process and its client.
type entrant struct {
	f      frameworks.Framework
	ch     *child
	client frameworks.Client
	// remote is the client process of a framework with a program of its
	// own (f.Program), which runs the closed loop; client is nil then
	remote *child
	err    error // why it was dropped from the sweep; nil while it runs
	// stalled is set when a window of it stalled (errStalled): its
	// callers may still be blocked in the client
	stalled bool
}

// close closes the client and stops the server process; it may be called
// more than once.
func (e *entrant) close() {
	if e.client != nil {
		e.client.Close()
		e.client = nil
	}
	if e.remote != nil {
		e.remote.stop()
		e.remote = nil
	}
	if e.ch != nil {
		e.ch.stop()
		e.ch = nil
	}
}

// closeWithin closes e like close, but returns after d even if closing
// has not finished.
func (e *entrant) closeWithin(d time.Duration) {
	done := doneWhen(e.close)
	select {
	case <-done:
	case <-time.After(d):
	}
}

// startEntrant starts f's server process, dials it and checks a first
// call. With -cpuprofile, the server writes <framework>-server.pprof.
func startEntrant(f frameworks.Framework, cfg config, log io.Writer) (*entrant, error) {
	var srvProfile string
	if cfg.profile != "" {
		srvProfile = filepath.Join(cfg.profile, f.Name+"-server.pprof")
	}
	ch, err := startChild(f, srvProfile, log)
	if err != nil {
		return nil, err
	}
	e := &entrant{f: f, ch: ch}
	if f.Program != "" {
		// The program's client checks a first call before it is ready.
		var cliProfile string
		if cfg.profile != "" {
			cliProfile = filepath.Join(cfg.profile, f.Name+"-client.pprof")
		}
		if e.remote, err = startRemote(f, ch.addr, cliProfile, log); err != nil {
			e.close()
			return nil, err
		}
		return e, nil
	}
	e.client, err = f.Dial(ch.addr)
	if err != nil {
		e.close()
		return nil, fmt.Errorf("dabbbench: dial %s: %w", ch.addr, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req := benchpb.NewMessage(cfg.size)
	reply, err := e.client.Echo(ctx, req)
	if err == nil {
		err = benchpb.Check(req, reply)
	}
	if err != nil {
		e.close()
		return nil, fmt.Errorf("dabbbench: first call: %w", err)
	}
	return e, nil
}

// window is one measurement of the sweep: a point in a round.
type window struct {
	round int // from 1
	spec
	warmup, duration time.Duration
}

// measureFunc measures one window of e.
type measureFunc func(e *entrant, w window) (point, error)

// sweep measures every point of cfg on every entrant, -rounds times: in
// each round, point after point, each entrant in turn, round r starting
// at entrant r mod n (rotation). An entrant whose window fails is closed,
// gets its err set and is left out of the later windows. A window that
// stalls (errStalled) ends the sweep: its entrant is marked stalled, and
// sweep returns the windows so far with the error. It returns every
// window measured, in order, with its round set.
func sweep(ents []*entrant, cfg config, prog *progress, measure measureFunc) ([]point, error) {
	specs := cfg.specs()
	var pts []point
	for r := range cfg.rounds {
		warm := cfg.warmupFor(r)
		for si, s := range specs {
			for _, i := range rotation(r, len(ents)) {
				e := ents[i]
				if e.err != nil {
					continue
				}
				prog.begin(r+1, cfg.rounds, s.label, e.f.Name, warm+cfg.duration)
				p, err := measure(e, window{round: r + 1, spec: s, warmup: warm, duration: cfg.duration})
				prog.end()
				if errors.Is(err, errStalled) {
					e.err, e.stalled = fmt.Errorf("stalled in round %d/%d at %s: %w", r+1, cfg.rounds, s.label, err), true
					prog.logf("%s: %v", e.f.Name, e.err)
					return pts, fmt.Errorf("dabbbench: %s: %w", e.f.Name, e.err)
				}
				if err != nil {
					e.err = fmt.Errorf("dropped in round %d/%d at %s: %w", r+1, cfg.rounds, s.label, err)
					e.close()
					prog.logf("%s: %v", e.f.Name, e.err)
					prog.drop(cfg.windowsLeft(r, si))
					continue
				}
				p.Framework, p.Round = e.f.Name, r+1
				pts = append(pts, p)
				prog.logf("round %d/%d %-7s %-16s %9.0f calls/s  p50 %-9v p99 %-9v p99.9 %-9v cpu µs/call %5.1f  errors %d",
					r+1, cfg.rounds, e.f.Name, s.label, p.rate(), round(p.P50), round(p.P99), round(p.P999), p.usPerCall(), p.Errors)
			}
		}
	}
	return pts, nil
}

// rotation returns the order in which round r (from 0) visits n
// entrants: r mod n first, then on, wrapping around; in odd rounds on
// backwards from there (order[i] = (r − i) mod n).
//
// So no framework is always first after a pause (with two, the first
// alternates), and a framework does not always follow the same one (a
// framework that leaves work behind would weigh on the same neighbour
// every round).
func rotation(r, n int) []int {
	order := make([]int, n)
	step := 1
	if r%2 == 1 {
		step = n - 1 // −1 mod n, kept non-negative
	}
	for i := range order {
		order[i] = (r + i*step) % n
	}
	return order
}

// measureEntrant is the measureFunc of a real run.
func measureEntrant(e *entrant, w window) (point, error) {
	if e.remote != nil {
		return measureRemote(e.remote, e.ch, w.spec, w.warmup, w.duration)
	}
	return measure(e.client, e.ch, w.spec, w.warmup, w.duration)
}

// worker is one calling goroutine's tallies.
type worker struct {
	done  atomic.Uint64 // calls completed, failed or not, also outside the window: for the stall watch
	h     hist.Histogram
	calls uint64
	errs  uint64 // failed calls in the window
	first error
	// failed calls outside the window: in the warm-up, or ending after
	// it; the first of them, and where ("in the warm-up", "after the
	// window")
	otherErrs  uint64
	otherFirst error
	otherWhere string
}

// measure runs s.c goroutines (and s.large 1 MiB ones) calling back to
// back for the warm-up and the window, and returns the window's point.
// Its Errors also count the calls that failed in the warm-up or ended in
// an error after the window, and its FirstErr is the window's first
// error, or else the first of those, saying where. If no call
// completes for stallLimit, measure returns errStalled at once, leaving
// the callers to end whenever their calls return.
func measure(client frameworks.Client, ch *child, s spec, warmup, duration time.Duration) (point, error) {
	c, large := s.c, s.large
	var measuring, stop atomic.Bool
	ctx := context.Background()
	workers := make([]*worker, c+large)
	for i := range workers {
		workers[i] = &worker{}
	}
	watch := newStallWatch(stallLimit, func() uint64 {
		var n uint64
		for _, w := range workers {
			n += w.done.Load()
		}
		return n
	})
	var wg sync.WaitGroup
	for i, w := range workers {
		size := s.size
		if i >= c {
			size = 1 << 20
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := newRequest(size)
			for !stop.Load() {
				t0 := time.Now()
				reply, err := client.Echo(ctx, req)
				if err == nil {
					err = benchpb.Check(req, reply)
				}
				d := time.Since(t0)
				w.done.Add(1) // the worker's own counter: no cache line shared between callers
				if !measuring.Load() || stop.Load() {
					if err != nil {
						w.otherErrs++
						if w.otherFirst == nil {
							w.otherFirst, w.otherWhere = err, "in the warm-up"
							if measuring.Load() {
								w.otherWhere = "after the window"
							}
						}
						time.Sleep(time.Millisecond) // do not spin on a broken client
					}
					continue
				}
				if err != nil {
					w.errs++
					if w.first == nil {
						w.first = err
					}
					time.Sleep(time.Millisecond)
					continue
				}
				w.calls++
				w.h.Record(d)
			}
		}()
	}
	if err := watch.sleep(warmup, "in the warm-up"); err != nil {
		stop.Store(true)
		return point{}, err
	}
	runtime.GC() // each window starts from the same heap state
	srvFrom, err := ch.sample()
	if err != nil {
		stop.Store(true)
		if werr := watch.wait(doneWhen(wg.Wait), "after the warm-up"); werr != nil {
			return point{}, fmt.Errorf("%w; %w", err, werr)
		}
		return point{}, err
	}
	cliFrom, t0 := takeSample(), time.Now()
	measuring.Store(true)
	if err := watch.sleep(duration, "in the window"); err != nil {
		stop.Store(true)
		return point{}, err
	}
	stop.Store(true)
	window, cliTo := time.Since(t0), takeSample()
	srvTo, err := ch.sample()
	if werr := watch.wait(doneWhen(wg.Wait), "while the window's last calls finished"); werr != nil {
		return point{}, werr
	}
	if err != nil {
		return point{}, err
	}
	p := point{Payload: s.payload, C: c, Large: large, Window: window,
		Client: cliTo.sub(cliFrom), Server: srvTo.sub(srvFrom)}
	p.ClientCPU, p.ServerCPU = p.Client.cpu, p.Server.cpu
	var small, big hist.Histogram
	var other *worker // the first with an error outside the window
	for i, w := range workers {
		if i >= c {
			big.Merge(&w.h)
			p.LargeN += w.calls
		} else {
			small.Merge(&w.h)
			p.Calls += w.calls
		}
		p.Errors += w.errs + w.otherErrs
		if w.first != nil && p.FirstErr == "" {
			p.FirstErr = w.first.Error()
		}
		if other == nil && w.otherFirst != nil {
			other = w
		}
	}
	if p.FirstErr == "" && other != nil {
		p.FirstErr = other.otherWhere + ": " + other.otherFirst.Error()
	}
	p.P50, p.P99, p.P999, p.Max = small.Quantile(0.5), small.Quantile(0.99), small.Quantile(0.999), small.Max()
	p.LargeP99 = big.Quantile(0.99)
	return p, nil
}

// doneWhen returns a channel that is closed once f has returned.
func doneWhen(f func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		f()
		close(done)
	}()
	return done
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Millisecond:
		return d.Round(100 * time.Microsecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	}
	return d.Round(time.Microsecond)
}

// startProfile starts a CPU profile written to path; stop ends it.
func startProfile(path string) (stop func(), err error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("dabbbench: profile: %w", err)
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("dabbbench: profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("dabbbench: profile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// loadAvg returns the load averages of /proc/loadavg, or "n/a".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "n/a"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "n/a"
	}
	return strings.Join(f[:3], " ")
}
