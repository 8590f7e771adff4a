package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress keeps one status line on stderr: the round, the point, the
// framework, the time left in the window and in the run. On a terminal
// the line redraws in place; otherwise a line is printed as each window
// begins. With -allocs, a last step, the allocation benchmarks, follows
// the windows.
type progress struct {
	w    io.Writer
	tty  bool
	tail time.Duration // estimate of the allocations step, 0 without it

	mu      sync.Mutex // guards following
	total   int        // steps: the windows and the allocations step
	planned int        // windows not yet begun
	rest    time.Duration
	done    int
	round   string // "round 2/3", or "" in the allocations step
	name    string
	label   string
	until   time.Time
	inTail  bool // the allocations step has begun
	drawn   bool
	stopped bool
	tick    *time.Ticker
	quit    chan struct{}
	exited  chan struct{}
}

func newProgress(w io.Writer, cfg config) *progress {
	n, d := cfg.windowsLeft(0, -1)
	nf := len(cfg.frameworks)
	p := &progress{w: w, total: n * nf, planned: n * nf, rest: time.Duration(nf) * d,
		quit: make(chan struct{}), exited: make(chan struct{})}
	if cfg.allocs {
		p.total++
		p.tail = allocsEstimate(cfg.frameworkNames())
	}
	if f, ok := w.(*os.File); ok {
		if st, err := f.Stat(); err == nil && st.Mode()&os.ModeCharDevice != 0 {
			p.tty = true
		}
	}
	if !p.tty {
		close(p.exited)
		return p
	}
	p.tick = time.NewTicker(250 * time.Millisecond)
	go func() {
		defer close(p.exited)
		for {
			select {
			case <-p.tick.C:
				p.mu.Lock()
				p.draw()
				p.mu.Unlock()
			case <-p.quit:
				return
			}
		}
	}()
	return p
}

// begin announces a window of round r of n, at the point label, of the
// framework name, lasting d.
func (p *progress) begin(r, n int, label, name string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.round, p.name, p.label, p.until = fmt.Sprintf("round %d/%d", r, n), name, label, time.Now().Add(d)
	if p.planned > 0 {
		p.planned--
		p.rest = max(p.rest-d, 0)
	}
	if p.tty {
		p.draw()
		return
	}
	fmt.Fprintf(p.w, "dabbbench: [%d/%d] %s %s %s: %v, about %v left in the run\n",
		p.done+1, p.total, p.round, label, name, d, p.left().Round(time.Second))
}

// drop takes n planned windows lasting d in all out of the run: those of
// a framework that failed.
func (p *progress) drop(n int, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n = min(n, p.planned)
	p.planned -= n
	p.total -= n
	p.rest = max(p.rest-d, 0)
}

// beginTail announces the last step, the allocation benchmarks, which
// take about p.tail.
func (p *progress) beginTail(name, label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inTail, p.done, p.round = true, p.total-1, ""
	p.name, p.label, p.until = name, label, time.Now().Add(p.tail)
	if p.tty {
		p.draw()
		return
	}
	fmt.Fprintf(p.w, "dabbbench: [%d/%d] %s: %s, ~%.0f s\n", p.total, p.total, name, label, p.tail.Seconds())
}

// end counts a finished step.
func (p *progress) end() {
	p.mu.Lock()
	p.done++
	p.name = ""
	p.mu.Unlock()
}

// left is the time left in the run; p.mu held.
func (p *progress) left() time.Duration {
	cur := max(time.Until(p.until), 0)
	if p.name == "" {
		cur = 0
	}
	if p.inTail {
		return cur
	}
	return cur + p.rest + p.tail
}

// draw redraws the status line; p.mu held.
func (p *progress) draw() {
	if !p.tty || p.stopped || p.name == "" {
		return
	}
	if p.inTail {
		fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s: %s, ~%.0f s: %.0f s left",
			p.total, p.total, p.name, p.label, p.tail.Seconds(), max(time.Until(p.until), 0).Seconds())
		p.drawn = true
		return
	}
	fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s %s %s: %.1fs left, run %v left",
		p.done+1, p.total, p.round, p.label, p.name, max(time.Until(p.until), 0).Seconds(), p.left().Round(time.Second))
	p.drawn = true
}

// clear erases the status line; p.mu held.
func (p *progress) clear() {
	if p.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.drawn = false
	}
}

// logf prints a line above the status line.
func (p *progress) logf(format string, args ...any) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.clear()
	fmt.Fprintf(p.w, format+"\n", args...)
	p.draw()
}

// wrap returns a writer for other output to stderr that keeps the status
// line intact.
func (p *progress) wrap(w io.Writer) io.Writer { return progressWriter{p, w} }

type progressWriter struct {
	p *progress
	w io.Writer
}

func (pw progressWriter) Write(b []byte) (int, error) {
	pw.p.mu.Lock()
	defer pw.p.mu.Unlock()
	pw.p.clear()
	n, err := pw.w.Write(b)
	pw.p.draw()
	return n, err
}

// stop ends the status line; it may be called more than once.
func (p *progress) stop() {
	p.mu.Lock()
	if p.stopped {
		p.mu.Unlock()
		return
	}
	p.clear()
	p.stopped = true
	p.mu.Unlock()
	if p.tick != nil {
		p.tick.Stop()
		close(p.quit)
	}
	<-p.exited
}
