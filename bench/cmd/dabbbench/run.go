package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
	"github.com/dabbrpc/dabb/bench/hist"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// point is one measured window.
type point struct {
	Framework string
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

// per100k returns CPU seconds per 100k calls of cpu over the point's calls.
func (p point) per100k(cpu time.Duration) float64 {
	if p.Calls == 0 {
		return 0
	}
	return cpu.Seconds() / float64(p.Calls) * 1e5
}

// syscallsPerCall returns the read and write system calls per call, client
// and server together.
func (p point) syscallsPerCall() (reads, writes float64) {
	if p.Calls == 0 {
		return 0, 0
	}
	n := float64(p.Calls)
	return float64(p.Client.sysr+p.Server.sysr) / n, float64(p.Client.sysw+p.Server.sysw) / n
}

// usPerCall returns client plus server CPU microseconds per call.
func (p point) usPerCall() float64 {
	if p.Calls == 0 {
		return 0
	}
	return float64((p.ClientCPU + p.ServerCPU).Microseconds()) / float64(p.Calls)
}

// results is the whole run.
type results struct {
	cfg      config
	start    time.Time
	end      time.Time
	loadFrom string
	loadTo   string
	points   []point
	skipped  []string      // frameworks that failed to start, with why
	allocs   *allocResults // the in-process benchmarks, nil without -allocs
}

func run(cfg config, stdout, stderr io.Writer) error {
	res := &results{cfg: cfg, start: time.Now(), loadFrom: loadAvg()}
	prog := newProgress(stderr, cfg)
	defer prog.stop()
	for _, f := range cfg.frameworks {
		pts, err := runFramework(f, cfg, prog, stderr)
		res.points = append(res.points, pts...)
		if err != nil {
			prog.logf("%s: %v", f.Name, err)
			res.skipped = append(res.skipped, fmt.Sprintf("%s: %v", f.Name, err))
		}
	}
	// The sweep's header (duration, load averages) describes the sweep
	// alone; the allocation benchmarks run after it, in their own process.
	res.end = time.Now()
	res.loadTo = loadAvg()
	if cfg.allocs {
		prog.beginTail("allocations", "in-process benchmarks")
		res.allocs = measureAllocs(context.Background(), cfg.frameworkNames())
		prog.end()
		if res.allocs.err != nil {
			prog.logf("%v", res.allocs.err)
		}
	}
	prog.stop()
	return writeResults(res, stdout)
}

// runFramework measures every point of one framework against its own
// server process.
func runFramework(f frameworks.Framework, cfg config, prog *progress, stderr io.Writer) ([]point, error) {
	var srvProfile string
	if cfg.profile != "" {
		srvProfile = filepath.Join(cfg.profile, f.Name+"-server.pprof")
		stop, err := startProfile(filepath.Join(cfg.profile, f.Name+"-client.pprof"))
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	ch, err := startChild(f.Name, srvProfile, prog.wrap(stderr))
	if err != nil {
		return nil, err
	}
	defer ch.stop()
	client, err := f.Dial(ch.addr)
	if err != nil {
		return nil, err
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	req := benchpb.NewMessage(cfg.size)
	reply, err := client.Echo(ctx, req)
	cancel()
	if err == nil {
		err = benchpb.Check(req, reply)
	}
	if err != nil {
		return nil, fmt.Errorf("first call: %w", err)
	}
	var pts []point
	for _, c := range cfg.conc {
		p, err := measure(client, ch, f.Name, cfg, c, 0, prog)
		if err != nil {
			return pts, err
		}
		pts = append(pts, p)
	}
	if cfg.mix {
		if cfg.payload != "small" || !slices.Contains(cfg.conc, cfg.mixC) {
			small := cfg
			small.payload, small.size = "small", 0
			p, err := measure(client, ch, f.Name, small, cfg.mixC, 0, prog)
			if err != nil {
				return pts, err
			}
			pts = append(pts, p)
		}
		small := cfg
		small.payload, small.size = "small", 0
		p, err := measure(client, ch, f.Name, small, cfg.mixC, cfg.large, prog)
		if err != nil {
			return pts, err
		}
		pts = append(pts, p)
	}
	return pts, nil
}

// worker is one calling goroutine's tallies.
type worker struct {
	h     hist.Histogram
	calls uint64
	errs  uint64
	first error
}

// measure runs c goroutines (and large 1 MiB ones) calling back to back
// for the warm-up and the window, and returns the window's point.
func measure(client frameworks.Client, ch *child, name string, cfg config, c, large int, prog *progress) (point, error) {
	var measuring, stop atomic.Bool
	ctx := context.Background()
	workers := make([]*worker, c+large)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{}
		workers[i] = w
		size := cfg.size
		if i >= c {
			size = 1 << 20
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := benchpb.NewMessage(size)
			for !stop.Load() {
				t0 := time.Now()
				reply, err := client.Echo(ctx, req)
				if err == nil {
					err = benchpb.Check(req, reply)
				}
				d := time.Since(t0)
				if !measuring.Load() || stop.Load() {
					if err != nil {
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
	label := fmt.Sprintf("c=%d", c)
	if large > 0 {
		label += fmt.Sprintf(" +%d×1MiB", large)
	}
	prog.begin(name, label, cfg.warmup+cfg.duration)
	time.Sleep(cfg.warmup)
	runtime.GC() // each window starts from the same heap state
	srvFrom, err := ch.sample()
	if err != nil {
		stop.Store(true)
		wg.Wait()
		return point{}, err
	}
	cliFrom, t0 := takeSample(), time.Now()
	measuring.Store(true)
	time.Sleep(cfg.duration)
	stop.Store(true)
	window, cliTo := time.Since(t0), takeSample()
	srvTo, err := ch.sample()
	wg.Wait()
	prog.end()
	if err != nil {
		return point{}, err
	}
	p := point{Framework: name, Payload: cfg.payload, C: c, Large: large, Window: window,
		Client: cliTo.sub(cliFrom), Server: srvTo.sub(srvFrom)}
	p.ClientCPU, p.ServerCPU = p.Client.cpu, p.Server.cpu
	var small, big hist.Histogram
	for i, w := range workers {
		if i >= c {
			big.Merge(&w.h)
			p.LargeN += w.calls
		} else {
			small.Merge(&w.h)
			p.Calls += w.calls
		}
		p.Errors += w.errs
		if w.first != nil && p.FirstErr == "" {
			p.FirstErr = w.first.Error()
		}
	}
	p.P50, p.P99, p.P999, p.Max = small.Quantile(0.5), small.Quantile(0.99), small.Quantile(0.999), small.Max()
	p.LargeP99 = big.Quantile(0.99)
	prog.logf("%-7s %-16s %9.0f calls/s  p50 %-9v p99 %-9v p99.9 %-9v cpu µs/call %5.1f  errors %d",
		name, label, p.rate(), round(p.P50), round(p.P99), round(p.P999), p.usPerCall(), p.Errors)
	return p, nil
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
