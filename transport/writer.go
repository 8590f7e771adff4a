// The one writer of a connection: frames from concurrent goroutines coalesced into few writes.

package transport

import (
	"context"
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

// frameWriter is the one writer of a connection, shared by the client and
// the server side. It coalesces frames from concurrent goroutines into as
// few write syscalls as possible without a goroutine of its own:
//
//   - A writer appends its encoded frame (protocol.AppendMessage straight
//     into buf, no intermediate copy) under mu.
//   - If nobody is flushing, it becomes the flusher: it swaps buf for the
//     spare buffer, writes the swapped-out bytes without holding mu, and
//     loops until buf is empty.
//   - If a flusher is active, it just returns: the flusher picks its frame
//     up on its next turn, together with everyone else's.
//
// At low load every frame is written inline by its own goroutine, which
// saves the goroutine wake-ups a dedicated writer goroutine costs per call;
// under load the frames that pile up while one write is in the kernel go
// out in the next single write. Measured with BenchmarkRoundTrip on a busy
// 2-core machine against the same buffer drained by a writer goroutine
// woken through a channel: inline was faster in wall time (median ~12 vs
// ~15 µs at parallelism 1, ~6.0 vs ~6.8 µs at 64) and in CPU per round trip
// (~10.8 vs ~11.6 µs; ~5.7 vs ~6.1 µs), with 0 allocations for both; the
// writer goroutine coalesced a little more (1.65 vs 1.79 write syscalls per
// round trip at 64), which did not pay for its wake-ups.
//
// The price is that a flusher may be kept busy writing frames of other
// goroutines. It is never kept waiting for room in the socket's send
// buffer, though: on Unix it makes the write system calls itself
// (rawWriter), and when the buffer is full it hands what is left to a
// goroutine of its own (finish), which holds the flusher's turn until the
// write completes, and returns; the caller then waits for its answer with
// its own timer and context. A large frame's writer waits for the socket
// (its payload is written in place) but only within the call's limit
// (writeLarge); cut off mid-frame, the rest of the frame is finished in
// the background (or, where a cut write's count is not exact, on Windows,
// the connection closes). Elsewhere, and with a connection that is not
// one of the net package's sockets (a wrapper), the flusher may block
// while the buffer is full. A write that
// has not completed after two heartbeat intervals, while the peer
// acknowledged none of its bytes, closes the connection (see state), which
// releases it. On Linux the peer's acknowledgements (TCP_INFO) tell a peer
// that stopped reading from a link too slow for one frame within two
// intervals, and a write the peer keeps acknowledging counts as life, so
// the side sending a large frame, which reads nothing meanwhile, does not
// take the peer for silent either. Elsewhere they cannot, and with the
// default interval of 60 s an 8 MiB frame needs ~70 KB/s. A frame the
// kernel took whole, which the peer is still reading slowly, shows nothing
// either way: the peer must answer a heartbeat within three intervals.
// (Reading has no such limit: any data read counts as life, see liveness.)
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
	err     error  // sticky: the first write error, or the close cause
	writes  uint64 // completed writes, for stall detection
	seen    uint64 // writes at the previous stall check

	acked atomic.Uint64 // the peer's acknowledged bytes at the previous stall check

	// raw writes without blocking (tryWrite); nil where nc cannot.
	raw rawWriter
	// cutting counts the cut calls that may still set a write deadline
	// (writeBuffers); only the turn's holder uses it.
	cutting sync.WaitGroup
}

// largePayload is the payload size from which a frame is written from the
// caller's own payload buffer (one writev of the frame's head and the
// payload) instead of being copied into the writer's buffer.
const largePayload = 64 << 10

func (w *frameWriter) init(nc net.Conn, onError func(error)) {
	w.nc = nc
	w.onError = onError
	w.turn.L = &w.mu
	w.raw.init(nc)
}

// eventKind selects an event frame for writeEvent.
type eventKind uint8

const (
	eventHeartbeat eventKind = iota
	eventHeartbeatResponse
	eventReadOnly
	eventCancel
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
// queued reports whether the frame entered the buffer: when it did not
// (err is the sticky error of a closed or broken connection, or lim's
// error), the frame provably never left; when it did and err is non-nil,
// this goroutine's own write failed, or lim ended it (then err is lim's),
// and the frame may have been partly sent.
//
// Only a large frame's writer waits on the socket, for its payload (its
// turn and the write itself, both within lim). A small frame's writer never
// waits longer than one system call: when the socket's send buffer is full,
// what is left goes to a goroutine that finishes the write (finish).
func (w *frameWriter) writeMessage(m *protocol.Message, lim limit) (queued bool, err error) {
	w.mu.Lock()
	if w.err != nil {
		err = w.err
		w.mu.Unlock()
		return false, err
	}
	if len(m.Payload) >= largePayload {
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
	return true, w.flushOrReturn()
}

// maxQueued bounds the bytes of small frames waiting behind a write in
// progress. A peer that stops reading fills its socket buffers; frames
// then pile up here, and without a bound its partner's memory grows until
// the stall check closes the connection, minutes later. Over it a frame is
// refused (errBackedUp): a client fails the call as not sent, a server
// closes the connection. A variable for tests.
var maxQueued = 32 << 20

// errBackedUp is the error of a frame refused because maxQueued bytes
// already wait for the peer to read.
var errBackedUp = errors.New("transport: peer is not reading")

// frameSlack is what a frame adds to its payload, as a guess for grow: the
// header and the body's strings and attachments are usually well below it
// (AppendMessage still grows the buffer when they are not).
const frameSlack = 512

// grow makes room for n bytes in buf with a pooled buffer of at least
// twice its capacity. Under load a flush can gather hundreds of frames
// (at c=1024 the server's buffer reached ~650 KiB); growing by append
// allocated, zeroed and copied at every doubling and left the old arrays
// to the GC: 2-3 % of each side's CPU (dabbbench profile). The old buffer
// goes back to the pool when it came from there; a buffer over
// bufpool.MaxKept goes back after its write (afterWrite).
func (w *frameWriter) grow(n int) {
	nb := bufpool.Get(max(n, 2*cap(w.buf)))[:len(w.buf)]
	copy(nb, w.buf)
	bufpool.Put(w.buf) // ignores buffers below bufpool.Min
	w.buf = nb
}

// finish writes b[n:] for a flusher that could not wait (a small frame's
// writer whose socket was full, a large frame's writer whose time was up),
// then flushes as usual: it holds the flusher's turn until done. It runs on
// its own goroutine, one per connection at most, which ends when the write
// completes or the connection closes.
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
	}
}

// companyTurns is how many flushes in a row may find nobody joining
// before flushers stop yielding.
const companyTurns = 16

// flushOrReturn is called with mu held after a frame was appended; it
// releases mu.
//
// While frames have recently joined other goroutines' flushes (company),
// the new flusher yields once before its first write: callers that are
// runnable now append their frames meanwhile and leave in the same
// syscall. At low load nobody joins, company stays at zero and frames are
// written at once: a yield would cost a trip through the scheduler and the
// wake-up of an idle thread for every call (measured with dabbbench at
// c=1: 12 % fewer calls/s with the unconditional yield).
func (w *frameWriter) flushOrReturn() error {
	if w.flushing {
		w.company = companyTurns
		w.mu.Unlock()
		return nil
	}
	w.flushing = true
	if w.company > 0 {
		w.company--
		w.mu.Unlock()
		runtime.Gosched()
		w.mu.Lock()
	}
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
// the flush is over (the buffer is empty, or the writer failed): mu is
// released then, and err is this write's error. Otherwise mu is still held
// and there is more to write.
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
