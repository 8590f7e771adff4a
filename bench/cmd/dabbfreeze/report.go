package main

import (
	"fmt"
	"io"
	"slices"
	"strings"
	"time"
)

// window is the calls that began in one window.
type window struct {
	from    time.Duration // against the freeze
	calls   int
	p99     time.Duration
	max     time.Duration
	frozen  int           // calls with an attempt on the frozen provider
	retried int           // calls with more than one attempt
	stall   time.Duration // the longest oversleep of a 1 ms sleep begun in the window
	gc      int           // GC cycles that ended in the window
}

// p99 returns the 99th percentile of ds, which it sorts.
func p99(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	return ds[len(ds)*99/100]
}

// touched reports whether c made an attempt on the frozen provider.
func (r *result) touched(c callRec) bool {
	return slices.ContainsFunc(c.attempts, func(a attemptRec) bool { return a.addr == r.frozen })
}

// baseline returns the p99 of the calls that began in the 2 s before the
// freeze.
func (r *result) baseline() time.Duration {
	var ds []time.Duration
	for _, c := range r.calls {
		if c.start >= -2*time.Second && c.start < 0 {
			ds = append(ds, c.took)
		}
	}
	return p99(ds)
}

// windows returns the windows of width w from 2 s before the freeze on.
func (r *result) windows(w time.Duration) []window {
	by := map[int][]time.Duration{}
	frozen, retried := map[int]int{}, map[int]int{}
	for _, c := range r.calls {
		if c.start < -2*time.Second {
			continue
		}
		i := int((c.start + 2*time.Second) / w)
		by[i] = append(by[i], c.took)
		if r.touched(c) {
			frozen[i]++
		}
		if len(c.attempts) > 1 {
			retried[i]++
		}
	}
	stall, gc := map[int]time.Duration{}, map[int]int{}
	for _, e := range r.process {
		at := e.t.Sub(r.freezeAt)
		if at < -2*time.Second {
			continue
		}
		i := int((at + 2*time.Second) / w)
		stall[i] = max(stall[i], e.over)
		if e.gc {
			gc[i]++
		}
	}
	var out []window
	for i := 0; len(by) > 0; i++ {
		ds, ok := by[i]
		if !ok {
			continue
		}
		delete(by, i)
		p := p99(ds)
		out = append(out, window{from: time.Duration(i)*w - 2*time.Second, calls: len(ds), p99: p, max: ds[len(ds)-1],
			frozen: frozen[i], retried: retried[i], stall: stall[i], gc: gc[i]})
	}
	return out
}

// worst returns the window with the highest p99 from 2 s after the freeze,
// leaving out the last (cut short by the end of the load).
func (r *result) worst(w time.Duration) window {
	ws := r.windows(w)
	var best window
	for _, x := range ws[:len(ws)-1] {
		if x.from >= 2*time.Second && x.p99 > best.p99 {
			best = x
		}
	}
	return best
}

func (r *result) worstRatio() float64 {
	return float64(r.worst(250*time.Millisecond).p99) / float64(r.baseline())
}

// late returns the calls that began 2 s or more after the freeze and made
// an attempt on the frozen provider, and the longest of them.
func (r *result) late() (n int, longest time.Duration) {
	for _, c := range r.calls {
		if c.start >= 2*time.Second && r.touched(c) {
			n++
			longest = max(longest, c.took)
		}
	}
	return n, longest
}

// summary writes one line: calls, failures, the baseline, the worst
// window from 2 s after the freeze, and the calls then that made an
// attempt on the frozen provider.
func (r *result) summary(out io.Writer) {
	b := r.baseline()
	w := r.worst(250 * time.Millisecond)
	n, longest := r.late()
	who := "the frozen provider"
	if !r.froze {
		who = "the provider a freeze would have stopped (a control run: none was)"
	}
	fmt.Fprintf(out, "%d calls, %d failed; baseline p99 %v; worst 250 ms window from 2 s after the freeze: +%v p99 %v (%.2fx, max %v; the client process stalled %v in it); from 2 s after the freeze %d calls tried %s (longest %v)\n",
		len(r.calls), r.nfail, b.Round(10*time.Microsecond), w.from, w.p99.Round(10*time.Microsecond),
		float64(w.p99)/float64(b), w.max.Round(10*time.Microsecond), w.stall.Round(time.Millisecond), n, who, longest.Round(10*time.Microsecond))
	if r.err != nil {
		fmt.Fprintf(out, "  first failure: %v\n", r.err)
	}
}

// print writes the windows over 2x the baseline or with a call on the
// frozen provider (every window with cfg.verbose), the events, and with
// cfg.trace the slow calls of the worst window and every call from 2 s
// after the freeze that tried the frozen provider.
func (r *result) print(out io.Writer, cfg config) {
	b := r.baseline()
	fmt.Fprintf(out, "  frozen provider %s (SIGSTOP: %v)\n", r.frozen, cfg.freeze)
	fmt.Fprintln(out, "  frozen: calls that tried the frozen provider; retried: calls with more than one attempt;")
	fmt.Fprintln(out, "  stall: the longest a 1 ms sleep of the client overslept (10 ms or more); gc: GC cycles ended")
	fmt.Fprintf(out, "  %10s %7s %10s %10s %6s %7s %7s %8s %3s\n", "window", "calls", "p99", "max", "x base", "frozen", "retried", "stall", "gc")
	for _, w := range r.windows(cfg.window) {
		if !cfg.verbose && w.p99 <= 2*b && w.frozen == 0 {
			continue
		}
		fmt.Fprintf(out, "  %+10v %7d %10v %10v %6.2f %7d %7d %8v %3d\n", w.from, w.calls, w.p99.Round(10*time.Microsecond),
			w.max.Round(10*time.Microsecond), float64(w.p99)/float64(b), w.frozen, w.retried, w.stall.Round(time.Millisecond), w.gc)
	}
	fmt.Fprintln(out, "  events:")
	// Failed attempts on the frozen provider come in bursts: one line per
	// burst.
	var n int
	var first, last time.Duration
	flush := func() {
		if n > 0 {
			fmt.Fprintf(out, "    %+10v %d failed attempts on the frozen provider, the last at %+v\n", first.Round(time.Millisecond), n, last.Round(time.Millisecond))
		}
		n = 0
	}
	for _, e := range r.events {
		at := e.t.Sub(r.freezeAt)
		if strings.HasPrefix(e.what, attemptEvent) {
			if n == 0 {
				first = at
			}
			n, last = n+1, at
			continue
		}
		flush()
		fmt.Fprintf(out, "    %+10v %s\n", at.Round(time.Millisecond), e.what)
	}
	flush()
	if !cfg.trace {
		return
	}
	fmt.Fprintln(out, "  calls from 2 s after the freeze that tried the frozen provider:")
	for _, c := range r.calls {
		if c.start >= 2*time.Second && r.touched(c) {
			r.printCall(out, c)
		}
	}
	w := r.worst(cfg.window)
	if w.p99 <= 2*b {
		fmt.Fprintln(out, "  no window from 2 s after the freeze over 2x the baseline")
		return
	}
	fmt.Fprintf(out, "  calls of the window at %+v slower than 2x the baseline (%v); those without attempts listed made one, on a live provider:\n", w.from, 2*b)
	for _, c := range r.calls {
		if c.start >= w.from && c.start < w.from+cfg.window && c.took > 2*b {
			r.printCall(out, c)
		}
	}
}

func (r *result) printCall(out io.Writer, c callRec) {
	fmt.Fprintf(out, "    began %+v took %v failed %v\n", c.start.Round(100*time.Microsecond), c.took.Round(100*time.Microsecond), c.failed)
	for _, a := range c.attempts {
		mark := ""
		if a.addr == r.frozen {
			mark = " (frozen)"
		}
		fmt.Fprintf(out, "      attempt to %s%s at %v after %q\n", a.addr, mark, a.at.Round(100*time.Microsecond), a.after)
	}
}
