// Whether a connection's peer is alive: reads counted and writes watched at each heartbeat tick.

package transport

import (
	"io"
	"sync"
	"sync/atomic"
)

// writeState is what the heartbeat tick sees of the writer.
type writeState uint8

const (
	writeQuiet   writeState = iota // nothing written, or nothing known of the peer
	writeMoving                    // a write in progress whose bytes the peer acknowledges
	writeStalled                   // one write in progress since the last tick, unacknowledged
)

// state reports what the writer did since the previous call.
// writeStalled means one write was in progress all along, with none of its
// bytes acknowledged. writeMoving means the peer acknowledged bytes of a
// write in progress. It is called from the heartbeat tick only, so its system call
// costs nothing per frame.
func (w *frameWriter) state() writeState {
	w.mu.Lock()
	flushing := w.flushing
	same := flushing && w.writes == w.seen
	w.seen = w.writes
	w.mu.Unlock()
	if !flushing {
		return writeQuiet
	}
	// On Linux the acknowledgements tell a peer that stopped reading from
	// a slow link. A large frame crossing a slow link is progress, and a
	// sign of life while the peer has nothing to send. Elsewhere they
	// cannot: a write must complete within the stall threshold. A frame the
	// kernel took whole shows nothing either way; the peer must then
	// answer a heartbeat within three intervals.
	acked, ok := ackedBytes(w.nc)
	switch moved := ok && acked != w.acked.Swap(acked); {
	case moved:
		return writeMoving
	case same:
		return writeStalled
	}
	return writeQuiet
}

// liveness watches one connection from its heartbeat timer, which ticks
// once per heartbeat interval. It costs the hot path a single atomic add
// per read from the socket: no clock reads, no per-call timers.
type liveness struct {
	// reads counts the reads from the socket that returned data, bumped
	// by the reader goroutine through source. Reads, not frames: a peer
	// slowly sending one large frame is making progress, not silent.
	reads atomic.Uint64

	mu     sync.Mutex // guards the fields below (a blocked tick may overlap the next)
	seen   uint64     // reads at the previous tick
	silent int        // consecutive ticks with nothing read
	stuck  int        // consecutive ticks with one write in progress
}

// source returns r counting its reads in l.
func (l *liveness) source(r io.Reader) io.Reader { return &countingReader{r, &l.reads} }

type countingReader struct {
	r io.Reader
	n *atomic.Uint64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	if n > 0 {
		c.n.Add(1)
	}
	return n, err
}

// Thresholds, in heartbeat intervals.
const (
	// silentTicks ticks without a byte read close the connection: the
	// peer has been silent for 3 intervals (it did not even answer our
	// heartbeats).
	silentTicks = 3
	// stuckTicks ticks that see the same write in progress close the
	// connection: the peer has not read anything for at least 2 intervals.
	stuckTicks = 3
)

// tickAction says what a connection does on a heartbeat tick.
type tickAction uint8

const (
	tickNothing tickAction = iota
	tickHeartbeat
	tickSilent
	tickStalled
)

// tick records one heartbeat interval. ws is the writer's state() for
// this tick. A write the peer is acknowledging counts as life: while a
// large frame goes out, the peer may have nothing to send, and a
// heartbeat would wait behind the frame.
func (l *liveness) tick(ws writeState) tickAction {
	l.mu.Lock()
	defer l.mu.Unlock()
	if ws == writeStalled {
		l.stuck++
	} else {
		l.stuck = 0
	}
	if l.stuck >= stuckTicks {
		return tickStalled
	}
	n := l.reads.Load()
	if n != l.seen || ws == writeMoving {
		l.seen = n
		l.silent = 0
		return tickNothing
	}
	l.silent++
	if l.silent >= silentTicks {
		return tickSilent
	}
	return tickHeartbeat
}
