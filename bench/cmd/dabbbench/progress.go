package main

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// progress keeps one status line on stderr: the framework, the point, the
// time left in the point and in the run. On a terminal the line redraws
// in place; otherwise a line is printed as each point begins. With
// -allocs, a last step, the allocation benchmarks, follows the points.
type progress struct {
	w        io.Writer
	tty      bool
	total    int // steps: the points and the allocations step
	points   int
	perPoint time.Duration
	tail     time.Duration // estimate of the allocations step, 0 without it

	mu      sync.Mutex // guards following
	done    int
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
	p := &progress{w: w, total: cfg.points(), points: cfg.points(), perPoint: cfg.warmup + cfg.duration,
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

// begin announces a point lasting d.
func (p *progress) begin(name, label string, d time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.name, p.label, p.until = name, label, time.Now().Add(d)
	if p.tty {
		p.draw()
		return
	}
	fmt.Fprintf(p.w, "dabbbench: [%d/%d] %s %s: %v, about %v left in the run\n",
		p.done+1, p.total, name, label, d, p.left().Round(time.Second))
}

// beginTail announces the last step, the allocation benchmarks, which
// take about p.tail.
func (p *progress) beginTail(name, label string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inTail, p.done = true, p.total-1
	p.name, p.label, p.until = name, label, time.Now().Add(p.tail)
	if p.tty {
		p.draw()
		return
	}
	fmt.Fprintf(p.w, "dabbbench: [%d/%d] %s: %s, ~%.0f s\n", p.total, p.total, name, label, p.tail.Seconds())
}

// end counts a finished point.
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
	rest := max(p.points-p.done-1, 0)
	return cur + time.Duration(rest)*p.perPoint + p.tail
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
	fmt.Fprintf(p.w, "\r\033[K[%d/%d] %s %s: %.1fs left, run %v left",
		p.done+1, p.total, p.name, p.label, max(time.Until(p.until), 0).Seconds(), p.left().Round(time.Second))
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
