// Calls run on the goroutine that read them, and the reading handed on when one takes long.

package transport

import (
	"sync"
	"time"
)

// inlinePeriod is how often the watch looks at the calls running on
// their reader. A call seen at two looks in a row has run for at least
// that long, and its connection's reading moves to a new goroutine. So a
// slow handler holds back the next frame of its connection for at most
// two periods.
const inlinePeriod = time.Millisecond

// inlineQuick is the longest the calls run on their reader since its
// buffer last ran out of whole frames may take together without
// consequence. Over it, if frames of the connection wait behind them (in
// the read buffer or the socket), the next inlineSkip requests of the
// connection go to workers. A handler that waits (on a database, on
// another service) would otherwise hold back every frame that comes
// behind it on the connection, up to the watch's 2 ms, call after call.
const (
	inlineQuick = 100 * time.Microsecond
	inlineSkip  = 64
)

// inlineIdleLooks is how many looks without a call run inline stop the
// watch until the next one.
const inlineIdleLooks = 64

// inlineWatch hands a connection's reading to a new goroutine when a
// call running on its reader takes longer than inlinePeriod. One per
// server; its goroutine starts with the first call run inline and counts
// in the server's WaitGroup.
type inlineWatch struct {
	mu      sync.Mutex    // guards the fields below and serverConn.inlineAt, inlineRun, inlineSeen
	running []*serverConn // connections whose reader runs a call
	runs    uint64        // calls run inline so far
	started bool          // the goroutine was started
	parked  bool          // the goroutine waits on wake
	wake    chan struct{} // capacity 1
}

// enter records that sc's reader, reading from st, is about to run a call.
func (iw *inlineWatch) enter(s *Server, sc *serverConn, st *readState) {
	iw.mu.Lock()
	sc.inlineState = st
	sc.inlineAt = len(iw.running)
	sc.inlineRun++
	iw.running = append(iw.running, sc)
	iw.runs++
	start, wake := !iw.started, iw.parked
	iw.started, iw.parked = true, false
	iw.mu.Unlock()
	switch {
	case start:
		iw.wake = make(chan struct{}, 1)
		s.wg.Add(1)
		go iw.loop(s)
	case wake:
		iw.wake <- struct{}{}
	}
}

// leave records that sc's reader has run its call. It reports false when
// the reading went to another goroutine meanwhile: the caller then stops.
func (iw *inlineWatch) leave(sc *serverConn) bool {
	iw.mu.Lock()
	defer iw.mu.Unlock()
	i := sc.inlineAt
	if i < 0 {
		return false
	}
	iw.removeLocked(i)
	return true
}

// removeLocked takes the connection at i off running.
func (iw *inlineWatch) removeLocked(i int) {
	last := len(iw.running) - 1
	iw.running[i].inlineAt = -1
	if i != last {
		iw.running[i] = iw.running[last]
		iw.running[i].inlineAt = i
	}
	iw.running[last] = nil
	iw.running = iw.running[:last]
}

// loop looks at the calls running inline every inlinePeriod until the
// server closes.
func (iw *inlineWatch) loop(s *Server) {
	defer s.wg.Done()
	t := time.NewTimer(s.cfg.inlinePeriod)
	defer t.Stop()
	var slow []*serverConn
	seenRuns, quiet := uint64(0), 0
	for {
		select {
		case <-t.C:
		case <-s.base.Done():
			return
		}
		iw.mu.Lock()
		for i := 0; i < len(iw.running); {
			sc := iw.running[i]
			if sc.inlineSeen == sc.inlineRun {
				// The same call as at the last look.
				iw.removeLocked(i)
				slow = append(slow, sc)
				continue
			}
			sc.inlineSeen = sc.inlineRun
			i++
		}
		if iw.runs == seenRuns {
			quiet++
		} else {
			seenRuns, quiet = iw.runs, 0
		}
		park := quiet >= inlineIdleLooks && len(iw.running) == 0
		iw.parked = park
		iw.mu.Unlock()
		for i, sc := range slow {
			// The reader will see it was taken off running and stop
			// after its call, leaving its state alone. The new reader
			// sends the next calls to workers, as after any slow call.
			sc.inlineState.skip = inlineSkip
			sc.resume(sc.inlineState)
			slow[i] = nil
		}
		slow = slow[:0]
		if park {
			select {
			case <-iw.wake:
				quiet = 0
			case <-s.base.Done():
				return
			}
		}
		t.Reset(s.cfg.inlinePeriod)
	}
}

// resume starts a goroutine that reads sc from st on.
func (sc *serverConn) resume(st *readState) {
	sc.s.wg.Add(1)
	go sc.read(st)
}
