// The one writer of a connection: frames from concurrent goroutines coalesced into few writes.

package transport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/protocol"
)

// frameWriter is the one writer of a connection, on both sides. It has no
// goroutine of its own. A caller appends its encoded frame to buf under mu.
// If nobody is flushing, the caller becomes the flusher: it writes buf
// until it is empty, taking along the frames others append meanwhile.
// Otherwise it returns, and the flusher takes its frame. A small frame's
// writer never waits for room in the socket (flushLoop); a large frame's
// waits only within its limit (writeLarge). docs/performance.md (Writer)
// holds the measurements behind this design.
type frameWriter struct {
	nc net.Conn
	// onError is called once, by the flusher whose write failed, without
	// mu held. The connection closes itself there.
	onError func(error)

	mu       sync.Mutex // guards the fields below
	turn     sync.Cond  // on mu: signalled when flushing ends, for writeLarge
	buf      []byte     // frames waiting to be written
	spare    []byte     // the buffer of the previous write, reused
	flushing bool       // a goroutine is in the flush loop
	// company says how recently a frame joined another goroutine's
	// flush: set to companyTurns then, it counts down by one per flush
	// that found nobody joining. A flusher yields before its first write
	// only while it is positive.
	company int
	// corked holds small frames in buf: the server's reader sets it
	// while it runs a burst of calls, and writes their answers together
	// when the burst ends (serverread.go). buf is still written at
	// corkMax.
	corked bool
	err    error  // sticky: the first write error, or the close cause
	writes uint64 // completed writes, for stall detection
	seen   uint64 // writes at the previous stall check

	acked atomic.Uint64 // the peer's acknowledged bytes at the previous stall check

	// raw writes without blocking (tryWrite); nil where nc cannot.
	raw rawWriter
	// sealed: nc is a *tls.Conn, whose writes must not be cut
	// (writeSealed).
	sealed bool
	// cutting counts the cut calls that may still set a write deadline
	// (writeBuffers); only the turn's holder uses it.
	cutting sync.WaitGroup
}

// largePayload is the payload size from which a frame is written from the
// caller's own buffer (writeLarge), not copied into the writer's.
const largePayload = 64 << 10

func (w *frameWriter) init(nc net.Conn, onError func(error)) {
	w.nc = nc
	w.onError = onError
	w.turn.L = &w.mu
	w.raw.init(nc)
	_, w.sealed = nc.(*tls.Conn)
}

// eventKind selects an event frame for writeEvent.
type eventKind uint8

const (
	eventHeartbeat eventKind = iota
	eventHeartbeatResponse
	eventReadOnly
	eventCancel
	eventGoAway
)

// limit is how long a caller may wait on the writer: until ctx is done or
// deadline passes (zero: no deadline). The zero limit waits as long as it
// takes.
type limit struct {
	ctx      context.Context
	deadline time.Time
}

// set reports whether the limit can end a wait.
func (l limit) set() bool {
	return !l.deadline.IsZero() || (l.ctx != nil && l.ctx.Done() != nil)
}

// err returns the context's error, or context.DeadlineExceeded once the
// deadline has passed, or nil.
func (l limit) err() error {
	if l.ctx != nil {
		if err := l.ctx.Err(); err != nil {
			return err
		}
	}
	if !l.deadline.IsZero() && !time.Now().Before(l.deadline) {
		return context.DeadlineExceeded
	}
	return nil
}

// writeMessage encodes m and writes it, or hands it to the active flusher.
// queued reports whether the frame entered the buffer. If it did not, the
// frame provably never left, and err is the connection's sticky error or
// lim's. If it did and err is non-nil, the frame may have been partly
// sent: this goroutine's write failed, or lim ended it (err is lim's).
//
// Only a large frame's writer waits on the socket, within lim. A small
// frame's writer never waits longer than one system call.
func (w *frameWriter) writeMessage(m *protocol.Message, lim limit) (queued bool, err error) {
	w.mu.Lock()
	if w.err != nil {
		err = w.err
		w.mu.Unlock()
		return false, err
	}
	if len(m.Payload) >= largePayload && protocol.PayloadAtEnd(m) {
		// A body format's payload is not the frame's tail: such a frame
		// is copied whole, as a small one is.
		return w.writeLarge(m, lim)
	}
	if w.flushing && len(w.buf) > maxQueued {
		n := len(w.buf)
		w.mu.Unlock()
		return false, fmt.Errorf("%w: %d bytes wait for it to read", errBackedUp, n)
	}
	if n := len(w.buf) + len(m.Payload) + frameSlack; n > cap(w.buf) && n > bufpool.Min {
		w.grow(n)
	}
	w.buf = protocol.AppendMessage(w.buf, m)
	// The frame goes out inline, from this goroutine. At low load that
	// saves the wake-up a writer goroutine would cost per call. Under load
	// the frames queued during one write leave together in the next.
	return true, w.flushOrReturn()
}

// maxQueued bounds the bytes of small frames waiting behind a write in
// progress. Over it a frame is refused (errBackedUp): a client fails the
// call as not sent, a server closes the connection. Without it, frames
// for a peer that stopped reading would pile up until the stall check,
// minutes later. A variable for tests.
var maxQueued = 32 << 20

// errBackedUp is the error of a frame refused because maxQueued bytes
// already wait for the peer to read.
var errBackedUp = errors.New("transport: peer is not reading")

// frameSlack is what a frame adds to its payload, as a guess for grow.
// The header, strings and attachments are usually well below it, and
// AppendMessage still grows the buffer when they are not.
const frameSlack = 512

// grow makes room for n bytes in buf with a pooled buffer of at least
// twice its capacity. The old buffer goes back to the pool if it came from
// there. A buffer over bufpool.MaxKept goes back after its write
// (afterWrite).
func (w *frameWriter) grow(n int) {
	// Under load a flush gathers hundreds of frames. Growing by append
	// would allocate, zero and copy at every doubling, and leave the old
	// arrays to the GC; a profile showed that cost (docs/performance.md).
	nb := bufpool.Get(max(n, 2*cap(w.buf)))[:len(w.buf)]
	copy(nb, w.buf)
	bufpool.Put(w.buf) // ignores buffers below bufpool.Min
	w.buf = nb
}

// finish writes b[n:] for a flusher that could not wait, then flushes as
// usual, holding the flusher's turn until done. That flusher was a small
// frame's writer whose socket was full, or a large frame's writer whose
// time was up. It runs on a goroutine of its own, one per connection at
// most, which ends when the write completes or the connection closes.
func (w *frameWriter) finish(b []byte, n int) {
	_, err := w.nc.Write(b[n:])
	w.mu.Lock()
	_ = w.wrote(b, err) // a failed write closes the connection itself
}

// writeEvent writes an event frame with the given id.
func (w *frameWriter) writeEvent(kind eventKind, id uint64) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.appendEventLocked(kind, id)
	return w.flushOrReturn()
}

// writeFrame writes a small frame already encoded, as writeEvent does.
func (w *frameWriter) writeFrame(frame []byte) error {
	w.mu.Lock()
	if w.err != nil {
		err := w.err
		w.mu.Unlock()
		return err
	}
	w.buf = append(w.buf, frame...)
	return w.flushOrReturn()
}

// queueEvent appends an event frame without writing it, so the caller
// never waits on the socket. It reports whether the caller became the
// flusher: then it must call flush, typically on another goroutine.
// Otherwise the frame went to the active flusher, or was dropped because
// the writer failed.
func (w *frameWriter) queueEvent(kind eventKind, id uint64) (mustFlush bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err != nil {
		return false
	}
	w.appendEventLocked(kind, id)
	if w.flushing {
		return false
	}
	w.flushing = true
	return true
}

// flush writes what queueEvent left; only the goroutine queueEvent told
// to flush calls it, once.
func (w *frameWriter) flush() error {
	w.mu.Lock()
	return w.flushLoop()
}

func (w *frameWriter) appendEventLocked(kind eventKind, id uint64) {
	switch kind {
	case eventHeartbeat:
		w.buf = protocol.AppendHeartbeat(w.buf, id)
	case eventHeartbeatResponse:
		w.buf = protocol.AppendHeartbeatResponse(w.buf, id)
	case eventReadOnly:
		w.buf = protocol.AppendReadOnly(w.buf, id)
	case eventCancel:
		w.buf = protocol.AppendCancel(w.buf, id)
	case eventGoAway:
		w.buf = protocol.AppendGoAway(w.buf, id)
	}
}

// companyTurns is how many flushes in a row may find nobody joining
// before flushers stop yielding.
const companyTurns = 16

// flushOrReturn is called with mu held after a frame was appended; it
// releases mu. The new flusher yields once before its first write while
// frames have recently joined other flushes (company).
func (w *frameWriter) flushOrReturn() error {
	if w.flushing {
		w.company = companyTurns
		w.mu.Unlock()
		return nil
	}
	if w.corked && len(w.buf) < corkMax {
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	if w.company > 0 {
		// Callers runnable now append their frames during the yield, and
		// leave in the same system call. At low load nobody joins and
		// company stays at zero. A yield then would cost a trip through
		// the scheduler and an idle thread's wake-up for every call
		// (docs/performance.md, Adaptive yield).
		w.company--
		w.mu.Unlock()
		runtime.Gosched()
		w.mu.Lock()
	}
	return w.flushLoop()
}

// corkMax is how many bytes a corked writer holds before it writes them.
const corkMax = 64 << 10

// cork makes small frames wait in the buffer until uncork.
func (w *frameWriter) cork() {
	w.mu.Lock()
	w.corked = true
	w.mu.Unlock()
}

// uncork ends cork and writes what waits, unless a flusher is at work,
// which takes it along.
func (w *frameWriter) uncork() error {
	w.mu.Lock()
	w.corked = false
	if w.flushing || len(w.buf) == 0 || w.err != nil {
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	return w.flushLoop()
}

// flushLoop writes the buffer until it is empty. It is called with mu
// held and flushing set by this goroutine; it releases mu.
func (w *frameWriter) flushLoop() error {
	for {
		b := w.buf
		w.buf = w.spare[:0]
		w.spare = nil
		w.mu.Unlock()

		// The flusher may be writing other goroutines' frames, so it must
		// not wait for room in the socket. On Unix tryWrite stops where the
		// send buffer is full, and a goroutine of its own (finish) writes
		// the rest, keeping the turn. The caller then waits for its answer
		// with its own timer and context. Elsewhere, and on a connection
		// wrapper, tryWrite may block; the stall check (state) then closes
		// a connection whose write does not move.
		n, blocked, err := w.raw.tryWrite(w.nc, b)
		if blocked {
			go w.finish(b, n)
			return nil
		}

		w.mu.Lock()
		if done, err := w.afterWrite(b, err); done {
			return err
		}
	}
}

// wrote finishes a flusher's write of b that ended with err, and flushes
// what was buffered meanwhile. It is called with mu held; it releases mu.
func (w *frameWriter) wrote(b []byte, err error) error {
	if done, err := w.afterWrite(b, err); done {
		return err
	}
	return w.flushLoop()
}

// afterWrite books a flusher's completed write of b. done reports that
// the flush is over: the buffer is empty, or the writer failed. Then mu is
// released, and err is this write's error. Otherwise mu is still held and
// there is more to write.
func (w *frameWriter) afterWrite(b []byte, err error) (done bool, _ error) {
	w.writes++
	if cap(b) <= bufpool.MaxKept {
		w.spare = b[:0]
	} else {
		bufpool.Put(b)
	}
	if err != nil {
		if w.err == nil {
			w.err = err
		}
		w.buf = w.buf[:0] // the connection is going down with them
		w.endFlushLocked()
		w.mu.Unlock()
		w.onError(err)
		return true, err
	}
	if len(w.buf) == 0 || w.err != nil {
		if w.err != nil {
			w.buf = w.buf[:0]
		}
		w.endFlushLocked()
		w.mu.Unlock()
		return true, nil
	}
	return false, nil
}

// endFlushLocked ends a flush and wakes the large writers waiting for
// their turn.
func (w *frameWriter) endFlushLocked() {
	w.flushing = false
	w.turn.Broadcast()
}

// fail makes every later write fail with err (the first cause wins). Frames
// still buffered are dropped.
func (w *frameWriter) fail(err error) {
	w.mu.Lock()
	if w.err == nil {
		w.err = err
	}
	if !w.flushing {
		w.buf = w.buf[:0]
	}
	w.turn.Broadcast()
	w.mu.Unlock()
}

// idle reports whether nothing is being written or waiting to be.
func (w *frameWriter) idle() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.flushing && len(w.buf) == 0
}
