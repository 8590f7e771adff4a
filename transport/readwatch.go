// Read timeouts of a server connection: a frame begun and not finished, a connection with no valid frame yet.

package transport

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// readWatch times the reads of one server connection from a timer of its
// own. The reader goroutine pays a few atomic stores per frame: no clock
// reads, no deadline set on the socket.
type readWatch struct {
	// frames counts the frames read whole (malformed ones too).
	frames atomic.Uint64
	// valid is set once the connection sent a valid frame.
	valid atomic.Bool
	// idleAt is the connection's read count (liveness.reads) when the
	// reader last waited for a frame with nothing buffered. While the
	// count still says so, no byte of the next frame has arrived.
	// notIdle means the reader began with bytes buffered.
	idleAt atomic.Uint64
	// paused is set while the reader waits for the body budget. That
	// wait is the server's doing, not the peer's.
	paused atomic.Bool

	mu    sync.Mutex // guards the fields below (a late tick may overlap the next)
	seen  uint64     // frames at the tick that saw the current frame begun
	since time.Time  // when a tick first saw the current frame begun; zero for none
}

const notIdle = math.MaxUint64

// waiting records that the reader is about to read a frame, with buffered
// bytes of it already in hand or not.
func (w *readWatch) waiting(buffered bool, reads uint64) {
	if buffered {
		w.idleAt.Store(notIdle)
		return
	}
	w.idleAt.Store(reads)
}

// watchPeriod is how often a connection's reads are checked. A timeout
// is noticed within a quarter of itself.
func watchPeriod(cfg *ServerConfig) time.Duration {
	return min(cfg.FirstFrameTimeout, cfg.FrameReadTimeout) / 4
}

// readVerdict says why a connection must close, if it must.
type readVerdict uint8

const (
	readOK readVerdict = iota
	readNoFrame
	readFrameSlow
)

// check looks at the reader at time now. reads is the connection's read
// count. The connection was accepted (or its handshake done) at start.
func (w *readWatch) check(now, start time.Time, reads uint64, cfg *ServerConfig) readVerdict {
	frames := w.frames.Load()
	if !w.valid.Load() && now.Sub(start) >= cfg.FirstFrameTimeout {
		return readNoFrame
	}
	begun := reads != w.idleAt.Load()
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.paused.Load() || !begun:
		w.since = time.Time{}
	case w.since.IsZero() || frames != w.seen:
		// A frame this tick is the first to see begun. It began
		// after the previous tick, so the timeout counts from here.
		w.seen, w.since = frames, now
	case now.Sub(w.since) >= cfg.FrameReadTimeout:
		return readFrameSlow
	}
	return readOK
}

// watchReads runs once per watchPeriod until the connection closes.
func (sc *serverConn) watchReads() {
	s := sc.s
	sc.mu.Lock()
	if sc.rt == nil {
		sc.mu.Unlock()
		return
	}
	sc.rt.Reset(watchPeriod(&s.cfg))
	sc.mu.Unlock()
	switch sc.watch.check(time.Now(), sc.start, sc.live.reads.Load(), &s.cfg) {
	case readNoFrame:
		s.log.Info("transport: no valid frame from the client in time; closing connection",
			"remote", sc.nc.RemoteAddr(), "first_frame_timeout", s.cfg.FirstFrameTimeout)
		sc.close()
	case readFrameSlow:
		s.log.Info("transport: frame not read whole in time; closing connection",
			"remote", sc.nc.RemoteAddr(), "frame_read_timeout", s.cfg.FrameReadTimeout)
		sc.close()
	}
}
