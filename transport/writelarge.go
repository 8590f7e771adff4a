// Frames with large payloads, written in place from the caller's buffer within the caller's limit.

package transport

import (
	"context"
	"errors"
	"net"
	"os"
	"time"

	"github.com/dabbrpc/dabb/internal/bufpool"
	"github.com/dabbrpc/dabb/protocol"
)

// writeLarge writes a frame with a large payload straight from m.Payload,
// without copying it. It waits for its turn as the flusher. Then one
// writev sends what is buffered, the frame's head and the payload, and it
// flushes what others buffered meanwhile. It returns once m.Payload has
// been written, so the caller may reuse it, or when lim ends first. It is
// called with mu held; it releases mu.
func (w *frameWriter) writeLarge(m *protocol.Message, lim limit) (queued bool, err error) {
	if w.flushing && w.err == nil && lim.set() {
		stop := w.wakeTurnAt(lim)
		defer close(stop)
	}
	for w.flushing && w.err == nil {
		if err := lim.err(); err != nil {
			w.mu.Unlock()
			return false, err
		}
		w.turn.Wait()
	}
	if w.err != nil {
		err = w.err
		w.mu.Unlock()
		return false, err
	}
	if err := lim.err(); err != nil { // it may have ended as the turn came
		w.mu.Unlock()
		return false, err
	}
	w.flushing = true
	w.buf = protocol.AppendFrameHead(w.buf, m)
	b := w.buf
	w.buf = w.spare[:0]
	w.spare = nil
	w.mu.Unlock()

	if w.sealed && lim.set() {
		return true, w.writeSealed(b, m.Payload, lim)
	}
	n, err := w.writeBuffers(net.Buffers{b, m.Payload}, lim)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && exactCounts {
		if lerr := lim.err(); lerr != nil {
			// The caller's time is up, mid-frame. The rest of the frame
			// must still go out, or the stream is broken: it is copied and
			// finished by another goroutine, and the connection lives on.
			// Where a cut write's count is not exact (Windows), this branch
			// is off and the failed write closes the connection.
			rest := bufpool.Get(len(b) + len(m.Payload) - int(n))
			rest = append(append(rest[:0], tail(b, n)...), tail(m.Payload, n-int64(len(b)))...)
			go w.finish(rest, 0)
			return true, lerr
		}
	}
	w.mu.Lock()
	return true, w.wrote(b, err)
}

// writeSealed writes a large frame, head (with the frames buffered
// before it) and payload, on a TLS connection, within lim. It holds the
// turn, and is called without mu.
func (w *frameWriter) writeSealed(head, payload []byte, lim limit) error {
	// A TLS write cut by a deadline leaves the connection broken for
	// good: the record it was sealing is lost. So the frame is copied and
	// written whole by a goroutine of its own. The caller waits for it
	// within lim, and may reuse its payload when it returns either way.
	frame := bufpool.Get(len(head) + len(payload))
	frame = append(append(frame[:0], head...), payload...)
	bufpool.Put(head)
	done := make(chan error, 1)
	go func() {
		_, err := w.nc.Write(frame)
		done <- err
		w.mu.Lock()
		_ = w.wrote(frame, err) // a failed write closes the connection itself
	}()
	var expired <-chan time.Time
	if !lim.deadline.IsZero() {
		t := time.NewTimer(time.Until(lim.deadline))
		defer t.Stop()
		expired = t.C
	}
	var cancelled <-chan struct{}
	if lim.ctx != nil {
		cancelled = lim.ctx.Done()
	}
	select {
	case err := <-done:
		return err
	case <-cancelled:
		return lim.ctx.Err()
	case <-expired:
		return context.DeadlineExceeded
	}
}

// tail returns p without its first n bytes (all of p for n <= 0).
func tail(p []byte, n int64) []byte {
	if n <= 0 {
		return p
	}
	if n >= int64(len(p)) {
		return nil
	}
	return p[n:]
}

// wakeTurnAt wakes the goroutines waiting for their turn when lim ends,
// so they can give up; closing the returned channel stops it.
func (w *frameWriter) wakeTurnAt(lim limit) chan<- struct{} {
	stop := make(chan struct{})
	var done <-chan struct{}
	if lim.ctx != nil {
		done = lim.ctx.Done()
	}
	var t *time.Timer
	var expired <-chan time.Time
	if !lim.deadline.IsZero() {
		t = time.NewTimer(time.Until(lim.deadline))
		expired = t.C
	}
	go func() {
		if t != nil {
			defer t.Stop()
		}
		select {
		case <-done:
		case <-expired:
		case <-stop:
			return
		}
		w.mu.Lock()
		w.turn.Broadcast()
		w.mu.Unlock()
	}()
	return stop
}

// aLongTimeAgo is a deadline in the past: it makes a blocked write return.
var aLongTimeAgo = time.Unix(1, 0)

// writeBuffers writes bufs; with a limit, the write ends with
// os.ErrDeadlineExceeded when lim does. n is what was written.
func (w *frameWriter) writeBuffers(bufs net.Buffers, lim limit) (n int64, err error) {
	if !lim.set() {
		return bufs.WriteTo(w.nc)
	}
	if !lim.deadline.IsZero() {
		_ = w.nc.SetWriteDeadline(lim.deadline)
	}
	var stop func() bool
	if lim.ctx != nil && lim.ctx.Done() != nil {
		w.cutting.Add(1)
		stop = context.AfterFunc(lim.ctx, w.cut)
	}
	n, err = bufs.WriteTo(w.nc)
	if stop != nil {
		if stop() {
			w.cutting.Done() // cut will not run
		}
		w.cutting.Wait() // no deadline may be set after the one cleared below
	}
	_ = w.nc.SetWriteDeadline(time.Time{})
	return n, err
}

// cut ends the large write in progress: its caller's context is done.
func (w *frameWriter) cut() {
	defer w.cutting.Done()
	_ = w.nc.SetWriteDeadline(aLongTimeAgo)
}
