// The worker pool: goroutines that run calls, a queue of calls waiting for
// one, idle workers kept and reaped.

package transport

import (
	"sync"
	"time"
)

// workerIdle is the least time a worker goroutine stays idle before it
// exits.
const workerIdle = 5 * time.Second

// idleWorker is a worker goroutine waiting for a request.
type idleWorker struct {
	ch  chan *serverCall // capacity 1; nil tells the worker to exit
	gen uint64           // reapGen when it went idle
}

// workers is a server's pool of worker goroutines. Its zero value is not
// usable: newWorkers makes one.
type workers struct {
	// wg is the server's: it counts every worker goroutine, so that
	// Close with WaitForHandlers and Shutdown wait for them.
	wg *sync.WaitGroup

	mu      sync.Mutex    // guards the fields below
	idle    []*idleWorker // a stack: the most recently idle on top
	reapGen uint64        // reaps so far
	reaper  *time.Timer   // retires long-idle workers; nil when none idle
	queued  callQueue     // requests waiting for a busy worker to finish
	// waking counts the workers handed a request that have not yet
	// looked at queued (handOn). While one has not, requests queue.
	waking int
	// closed is set by close. From then on no worker goes idle.
	closed bool
}

// newWorkers returns an empty pool whose goroutines wg counts.
func newWorkers(wg *sync.WaitGroup) *workers { return &workers{wg: wg} }

// handOff gives call to a worker. With no worker on its way to the queue,
// it wakes an idle one with call, or starts one. Otherwise call joins the
// queue, and the first worker to reach it takes it: the one on its way, or
// one that finished its call.
func (p *workers) handOff(call *serverCall) {
	p.mu.Lock()
	if p.waking > 0 {
		p.queued.push(call)
		p.mu.Unlock()
		return
	}
	p.waking++
	w := p.popIdle()
	p.mu.Unlock()
	p.wake(w, call)
}

// wake hands call to w, or to a new worker when w is nil.
func (p *workers) wake(w *idleWorker, call *serverCall) {
	if w != nil {
		w.ch <- call
		return
	}
	p.wg.Add(1)
	go p.worker(call)
}

// worker runs call, then the queued calls it finds, then waits idle for
// the next call handed to it. One reaper timer per server retires
// long-idle workers (reap). docs/performance.md ("Server workers") has the
// measurements.
func (p *workers) worker(call *serverCall) {
	defer p.wg.Done()
	// Reusing the goroutine saves the allocation of a go statement with
	// an argument per call, and keeps grown stacks warm.
	w := &idleWorker{ch: make(chan *serverCall, 1)}
	for call != nil {
		p.handOn()
		for ; call != nil; call = p.next(w) {
			call.run()
		}
		call = w.wait()
	}
}

// handOn is the first thing a worker handed a call does, before it runs
// it: if requests queued meanwhile, it hands the oldest to another worker.
// So a queued request never waits behind a handler that blocks.
func (p *workers) handOn() {
	p.mu.Lock()
	p.waking--
	next := p.queued.pop()
	var w *idleWorker
	if next != nil {
		p.waking++
		w = p.popIdle()
	}
	p.mu.Unlock()
	if next != nil {
		p.wake(w, next)
	}
}

// next returns the oldest queued call. With none, it pushes w on the idle
// stack and returns nil; once the pool is closed, it tells w to exit
// instead, as close tells the idle ones.
func (p *workers) next(w *idleWorker) *serverCall {
	p.mu.Lock()
	defer p.mu.Unlock()
	if call := p.queued.pop(); call != nil {
		return call
	}
	// close tells the workers idle then to exit; one that finishes
	// after sees closed.
	if p.closed {
		w.ch <- nil // w is busy, so its channel is empty
		return nil
	}
	w.gen = p.reapGen
	p.idle = append(p.idle, w)
	if p.reaper == nil {
		p.reaper = time.AfterFunc(workerIdle, p.reap)
	}
	return nil
}

// parkedStack is the stack, in bytes, a waiting worker keeps in use below
// its wait. The GC then leaves grown stacks of up to 4 × parkedStack
// (16 KiB) as they are. An idle worker holds 8 KiB of stack at least.
const parkedStack = 4 << 10

// wait blocks until the worker's next call, or nil when it must exit.
//
//go:noinline
func (w *idleWorker) wait() *serverCall {
	// Each GC halves the stack of a goroutine using less than a quarter
	// of it. A worker waiting in a shallow frame lost, at every GC, the
	// stack its calls had grown, and its next call copied it back
	// (runtime.copystack). Waiting below this frame keeps it.
	var floor [parkedStack]byte
	holdStack(floor[:])
	// A bare receive: no timer and no select. A select over the work,
	// an idle timer and the server's context cost CPU, and arming the
	// timer woke the network poller on every call.
	return <-w.ch
}

// holdStack makes the compiler keep b's array in its caller's frame.
//
//go:noinline
func holdStack(b []byte) { b[len(b)-1] = 0 }

// popIdle pops the most recently idle worker, or returns nil. The caller
// holds workersMu.
func (p *workers) popIdle() *idleWorker {
	n := len(p.idle)
	if n == 0 {
		return nil
	}
	w := p.idle[n-1]
	p.idle[n-1] = nil
	p.idle = p.idle[:n-1]
	return w
}

// reap retires the workers idle since before the previous reap: a whole
// workerIdle period at least. They sit at the bottom of the stack, since
// workers are pushed in the order they went idle.
func (p *workers) reap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return // close stopped the reaper
	}
	old := 0
	for old < len(p.idle) && p.idle[old].gen < p.reapGen {
		p.idle[old].ch <- nil
		old++
	}
	n := copy(p.idle, p.idle[old:])
	clear(p.idle[n:])
	p.idle = p.idle[:n]
	p.reapGen++
	if n == 0 {
		p.reaper = nil // the next worker to go idle starts it again
		return
	}
	p.reaper.Reset(workerIdle)
}

// close makes idle workers exit now, and busy ones once their call and
// the queue are done. Server.enter calls it on closing the server.
func (p *workers) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, w := range p.idle {
		w.ch <- nil
	}
	p.idle = nil
	if p.reaper != nil {
		p.reaper.Stop()
		p.reaper = nil
	}
}

// callQueue is a FIFO of calls: a ring that doubles when full. Its length
// is bounded by MaxConcurrent, which dispatch checks first.
type callQueue struct {
	buf  []*serverCall // len is 0 or a power of two
	head int
	n    int
}

func (q *callQueue) push(call *serverCall) {
	if q.n == len(q.buf) {
		grown := make([]*serverCall, max(16, 2*len(q.buf)))
		for i := range q.n {
			grown[i] = q.buf[(q.head+i)&(len(q.buf)-1)]
		}
		q.buf, q.head = grown, 0
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = call
	q.n++
}

// pop returns the oldest call, or nil when the queue is empty.
func (q *callQueue) pop() *serverCall {
	if q.n == 0 {
		return nil
	}
	call := q.buf[q.head]
	q.buf[q.head] = nil
	q.head = (q.head + 1) & (len(q.buf) - 1)
	q.n--
	return call
}
