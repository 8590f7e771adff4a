// The worker pool: goroutines that run calls, a queue of calls waiting for
// one, idle workers kept and reaped.

package transport

import "time"

// workerIdle is the least time a worker goroutine stays idle before it
// exits.
const workerIdle = 5 * time.Second

// idleWorker is a worker goroutine waiting for a request.
type idleWorker struct {
	ch  chan *serverCall // capacity 1; nil tells the worker to exit
	gen uint64           // reapGen when it went idle
}

// handOff gives call to a worker. With no worker on its way to the queue,
// it wakes an idle one with call, or starts one. Otherwise call joins the
// queue, and the first worker to reach it takes it: the one on its way, or
// one that finished its call.
func (s *Server) handOff(call *serverCall) {
	s.workersMu.Lock()
	if s.waking > 0 {
		s.queued.push(call)
		s.workersMu.Unlock()
		return
	}
	s.waking++
	w := s.popIdle()
	s.workersMu.Unlock()
	s.wake(w, call)
}

// wake hands call to w, or to a new worker when w is nil.
func (s *Server) wake(w *idleWorker, call *serverCall) {
	if w != nil {
		w.ch <- call
		return
	}
	s.wg.Add(1)
	go s.worker(call)
}

// worker runs call, then the queued calls it finds, then waits idle for
// the next call handed to it. One reaper timer per server retires
// long-idle workers (reap). docs/performance.md ("Server workers") has the
// measurements.
func (s *Server) worker(call *serverCall) {
	defer s.wg.Done()
	// Reusing the goroutine saves the allocation of a go statement with
	// an argument per call, and keeps grown stacks warm.
	w := &idleWorker{ch: make(chan *serverCall, 1)}
	for call != nil {
		s.handOn()
		for ; call != nil; call = s.next(w) {
			call.run()
		}
		call = w.wait()
	}
}

// handOn is the first thing a worker handed a call does, before it runs
// it: if requests queued meanwhile, it hands the oldest to another worker.
// So a queued request never waits behind a handler that blocks.
func (s *Server) handOn() {
	s.workersMu.Lock()
	s.waking--
	next := s.queued.pop()
	var w *idleWorker
	if next != nil {
		s.waking++
		w = s.popIdle()
	}
	s.workersMu.Unlock()
	if next != nil {
		s.wake(w, next)
	}
}

// next returns the oldest queued call. With none, it pushes w on the idle
// stack and returns nil; once the server is closed, it tells w to exit
// instead, as closeWorkers tells the idle ones.
func (s *Server) next(w *idleWorker) *serverCall {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	if call := s.queued.pop(); call != nil {
		return call
	}
	// enter stores closed before closeWorkers takes workersMu. A worker
	// pushed before that is told to exit there; one after sees closed.
	if s.current() == closed {
		w.ch <- nil // w is busy, so its channel is empty
		return nil
	}
	w.gen = s.reapGen
	s.idleWorkers = append(s.idleWorkers, w)
	if s.reaper == nil {
		s.reaper = time.AfterFunc(workerIdle, s.reap)
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
func (s *Server) popIdle() *idleWorker {
	n := len(s.idleWorkers)
	if n == 0 {
		return nil
	}
	w := s.idleWorkers[n-1]
	s.idleWorkers[n-1] = nil
	s.idleWorkers = s.idleWorkers[:n-1]
	return w
}

// reap retires the workers idle since before the previous reap: a whole
// workerIdle period at least. They sit at the bottom of the stack, since
// workers are pushed in the order they went idle.
func (s *Server) reap() {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	if s.current() == closed {
		return // closeWorkers stops the reaper
	}
	old := 0
	for old < len(s.idleWorkers) && s.idleWorkers[old].gen < s.reapGen {
		s.idleWorkers[old].ch <- nil
		old++
	}
	n := copy(s.idleWorkers, s.idleWorkers[old:])
	clear(s.idleWorkers[n:])
	s.idleWorkers = s.idleWorkers[:n]
	s.reapGen++
	if n == 0 {
		s.reaper = nil // the next worker to go idle starts it again
		return
	}
	s.reaper.Reset(workerIdle)
}

// closeWorkers makes idle workers exit now, and busy ones once their
// call and the queue are done. enter calls it on closing the server.
func (s *Server) closeWorkers() {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	for _, w := range s.idleWorkers {
		w.ch <- nil
	}
	s.idleWorkers = nil
	if s.reaper != nil {
		s.reaper.Stop()
		s.reaper = nil
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
