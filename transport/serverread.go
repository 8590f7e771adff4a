// A server connection's reader: the frames it reads and what becomes of each.

package transport

import (
	"bufio"
	"crypto/tls"
	"errors"
	"io"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// serve is the connection's first reader goroutine.
func (sc *serverConn) serve() {
	s := sc.s
	if tc, ok := sc.nc.(*tls.Conn); ok && !sc.handshake(tc) {
		sc.close()
		s.wg.Done()
		return
	}
	sc.start = time.Now()
	sc.mu.Lock()
	if !sc.closed {
		sc.hb = time.AfterFunc(s.cfg.HeartbeatInterval, sc.tick)
		sc.rt = time.AfterFunc(watchPeriod(&s.cfg), sc.watchReads)
	}
	sc.mu.Unlock()

	if sc.drained {
		sc.announce()
	}
	st := &readState{first: true}
	st.src = sc.live.source(sc.nc)
	st.br = newReader(st.src)
	st.idle = newIdleReader(sc.nc)
	st.rd = protocol.NewReader(st.br, s.cfg.MaxBody)
	st.rd.SetBudget(connBudget{sc})
	st.rd.SetSerializations(s.cfg.Serializations)
	sc.read(st)
}

// readState is what the connection's reader holds. It passes whole to the
// goroutine that takes the reading over (inline.go).
type readState struct {
	src   io.Reader
	br    *bufio.Reader
	idle  idleReader
	rd    *protocol.Reader
	first bool // no frame read yet
	valid bool // a valid frame was read
	// skip counts the requests still to hand to workers, after calls
	// run here held back the frames behind them longer than inlineQuick.
	skip int
	// corked: the connection's writer holds the answers of the burst of
	// calls run here until the read buffer has no whole frame left.
	corked bool
	// burst is how long the calls run here since the read buffer last
	// ran out of whole frames took.
	burst time.Duration
	// early counts the answers of a burst still to run before those
	// held so far are written (burstHead).
	early int
	// waitFrom is when the last burst ended: the reader began to wait
	// for the next one.
	waitFrom time.Time
}

// burstHead is how many answers of a burst the reader waited for are
// written as soon as they are ready, together, before the rest of the
// burst runs. burstGap is the wait that tells such a burst from one a
// saturated connection had ready at once. docs/performance.md has the
// measurements behind both.
const (
	burstHead = 2
	burstGap  = 10 * time.Microsecond
)

// read reads and dispatches frames until the connection fails, or until
// it hands the reading to another goroutine while it runs a handler. The
// goroutine that ends the reading closes the connection.
func (sc *serverConn) read(st *readState) {
	s := sc.s
	handed, inline := false, false
	defer func() {
		if inline {
			// The handler ended this goroutine (runtime.Goexit) while it
			// ran inline. Reading goes on elsewhere.
			handed = true
			if s.inline.leave(sc) {
				sc.resume(st)
			}
		}
		if !handed {
			if st.br.Buffered() == 0 {
				freeReader(st.br)
			}
			sc.close()
		}
		s.wg.Done()
	}()
	br, rd := st.br, st.rd
	for ; ; st.first = false {
		if !wholeFrame(br) {
			// The burst is over, or the frame behind it is still on its
			// way: its answers leave in one write before the next read
			// waits.
			st.burst = 0
			if st.corked {
				st.corked = false
				_ = sc.w.uncork() // a failed write closes the connection itself
			}
			st.waitFrom = time.Now()
		}
		call := serverCallPool.Get().(*serverCall)
		sc.watch.waiting(br.Buffered() > 0, sc.live.reads.Load())
		if br.Buffered() == 0 && s.nconns.Load() > lendFrom {
			st.idle.wait(br, st.src)
		}
		err := rd.Read(&call.req)
		if err == nil || errors.Is(err, protocol.ErrMalformed) {
			sc.watch.frames.Add(1)
		}
		if err != nil {
			if st.first && s.cfg.TLS == nil && errors.Is(err, protocol.ErrBadMagic) && tlsRecord(call.req.Header[:]) {
				putServerCall(call)
				sc.answerTLSClient()
				return
			}
			if errors.Is(err, protocol.ErrUnknownSerialization) {
				sc.answerForeign(&call.req)
				putServerCall(call)
				continue
			}
			if errors.Is(err, protocol.ErrMalformed) {
				// The frame was consumed whole: answer it and go on.
				if f := call.req.Header.Flags(); f.IsRequest() && !f.IsEvent() {
					s.rejected(RejectBadRequest)
				}
				if call.req.Header.Flags().IsTwoWay() {
					sc.answer(&call.req, protocol.StatusBadRequest, []byte(err.Error()))
				}
				putServerCall(call)
				continue
			}
			if errors.Is(err, protocol.ErrBodyTooLarge) && sc.skipBody(br, &call.req, err) {
				sc.watch.frames.Add(1)
				putServerCall(call)
				continue
			}
			putServerCall(call)
			sc.logReadError(err)
			return
		}
		if !st.valid {
			st.valid = true
			sc.watch.valid.Store(true)
		}
		req := &call.req
		f := req.Header.Flags()
		switch {
		case f.IsEvent():
			switch {
			case req.IsHeartbeat():
				_ = sc.w.writeEvent(eventHeartbeatResponse, req.Header.ID())
			case req.IsCancel():
				sc.cancelCall(req.Header.ID())
			}
			putServerCall(call)
		case !f.IsRequest():
			putServerCall(call) // a stray response: nothing waits for it
		default:
			mayInline := st.skip == 0
			if st.skip > 0 {
				st.skip--
			}
			if !sc.dispatch(call, mayInline) {
				continue
			}
			// No other call runs for this connection: this one runs here,
			// with no hand-off to a worker (inline.go). The frames read
			// with it wait for it, and the answers of such a burst leave
			// together, but for the first ones of a burst the reader
			// waited for.
			if !st.corked && wholeFrame(br) {
				st.corked = true
				st.early = 0
				if time.Since(st.waitFrom) > s.cfg.burstGap {
					// The reader waited for this burst: its callers
					// send in waves, and the connection is not
					// saturated. The first answers leave at once, so
					// that their callers send again while the rest
					// runs. A burst found without waiting (a saturated
					// connection) is answered in one write: the writes
					// saved are worth more there.
					st.early = burstHead
				}
				sc.w.cork()
			}
			// st is read before enter: from then on the watch may pass it
			// to a new reader.
			left, behind := s.cfg.inlineQuick-st.burst, br.Buffered() > 0
			inline = true
			s.inline.enter(s, sc, st)
			took, slow := call.runInline(left, behind, st.idle.rc)
			inline = false
			if !s.inline.leave(sc) {
				// st is the new reader's now (the watch set its skip).
				handed = true
				return
			}
			if st.early > 0 {
				if st.early--; st.early == 0 && st.corked {
					_ = sc.w.uncork() // a failed write closes the connection itself
					sc.w.cork()
				}
			}
			if st.burst += took; slow {
				// The frames that came meanwhile waited for the calls run
				// here. The connection's next calls go to workers for a
				// while.
				st.skip = inlineSkip
			}
		}
	}
}
