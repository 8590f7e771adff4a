// The worker pool: goroutines that run calls, kept idle and reaped.

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

// worker runs call, then the further calls handed to it while it is idle.
// An idle worker waits on its own channel; dispatch takes it off a stack.
// One reaper timer per server retires long-idle workers (reap).
// docs/performance.md ("Server workers") has the measurements.
func (s *Server) worker(call *serverCall) {
	defer s.wg.Done()
	// Reusing the goroutine saves the allocation of a go statement with
	// an argument per call, and keeps grown stacks warm.
	w := &idleWorker{ch: make(chan *serverCall, 1)}
	for call != nil {
		call.run()
		if !s.putIdle(w) {
			return
		}
		call = w.wait()
	}
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

// takeIdle pops the most recently idle worker, or returns nil.
func (s *Server) takeIdle() *idleWorker {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	n := len(s.idleWorkers)
	if n == 0 {
		return nil
	}
	w := s.idleWorkers[n-1]
	s.idleWorkers[n-1] = nil
	s.idleWorkers = s.idleWorkers[:n-1]
	return w
}

// putIdle pushes w on the idle stack. It reports false once the server
// is closed: the worker must exit.
func (s *Server) putIdle(w *idleWorker) bool {
	s.workersMu.Lock()
	defer s.workersMu.Unlock()
	// enter stores closed before closeWorkers takes workersMu. A worker
	// pushed before that is told to exit there; one after sees closed.
	if s.current() == closed {
		return false
	}
	w.gen = s.reapGen
	s.idleWorkers = append(s.idleWorkers, w)
	if s.reaper == nil {
		s.reaper = time.AfterFunc(workerIdle, s.reap)
	}
	return true
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
// call is done. enter calls it on closing the server.
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
