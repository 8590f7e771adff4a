// A connection's share of the server's BodyBudget.

package transport

import "github.com/dabbrpc/dabb/protocol"

// connBudget takes a connection's large bodies from the server's
// BodyBudget. A wait for it stops the connection's frame clock. It ends
// when the connection closes.
type connBudget struct{ sc *serverConn }

var _ protocol.Budget = connBudget{}

func (b connBudget) Acquire(n int) error {
	sem := b.sc.s.bodies
	if sem.TryAcquire(int64(n)) {
		return nil
	}
	// The peer is not slow: the server does not read. FrameReadTimeout
	// counts from when the wait is over.
	w := &b.sc.watch
	w.paused.Store(true)
	defer w.paused.Store(false)
	return sem.Acquire(b.sc.ctx, int64(n))
}

func (b connBudget) Release(n int) { b.sc.s.bodies.Release(int64(n)) }
