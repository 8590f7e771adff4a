// Smooth weighted round robin.

package balancer

import (
	"sync"
	"sync/atomic"
)

// Limits of the precomputed round robin sequence: its length (one int32 a
// slot) and the work to compute it at Update (length × instances).
const (
	maxSeqLen  = 1 << 16
	maxSeqWork = 1 << 23
	// rrTries bounds the slots a pick consumes looking for a usable
	// instance before it falls back to a weighted draw among the usable.
	rrTries = 16
)

// roundRobin is smooth weighted round robin: every instance's current
// weight grows by its weight, the largest is chosen and loses the total.
// A cycle is the sum of the weights divided by their greatest common
// divisor. Over one cycle every instance is chosen exactly its weight's
// share of times, spread out: weights 5, 1, 1 give a a b a c a a.
//
// Update computes the cycle once when it is short enough, as it always is
// for equal weights. A pick is then one atomic increment. Otherwise picks
// run the algorithm under a mutex, O(instances) each.
type roundRobin struct {
	seq []int32 // one cycle; nil when picks take the mutex path

	_     [64]byte // keep the cursors off the read-only fields' cache line
	next  atomic.Uint64
	retry atomic.Uint64 // retries' and hedges' cursor (PickExcept)
	_     [48]byte

	mu  sync.Mutex
	cur []int64 // current weights, mutex path
}

func (rr *roundRobin) init(weights []uint64, rnd func() uint64) {
	n := len(weights)
	if n == 0 {
		return
	}
	g := weights[0]
	for _, w := range weights[1:] {
		g = gcd(g, w)
	}
	var cycle uint64
	for _, w := range weights {
		cycle += w / g
	}
	if cycle > maxSeqLen || cycle*uint64(n) > maxSeqWork {
		rr.cur = make([]int64, n)
		return
	}
	rr.seq = make([]int32, cycle)
	if cycle == uint64(n) { // equal weights: plain round robin
		for t := range rr.seq {
			rr.seq[t] = int32(t)
		}
		rr.next.Store(rnd() % cycle)
		rr.retry.Store(rnd() % cycle)
		return
	}
	cur := make([]int64, n)
	for t := range rr.seq {
		best := 0
		for i, w := range weights {
			cur[i] += int64(w / g)
			if cur[i] > cur[best] {
				best = i
			}
		}
		cur[best] -= int64(cycle)
		rr.seq[t] = int32(best)
	}
	// Start at a random slot so that clients updated at the same moment
	// do not all begin with the same instance.
	rr.next.Store(rnd() % cycle)
	rr.retry.Store(rnd() % cycle)
}

func gcd(a, b uint64) uint64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// pickRoundRobin takes the next slot of the cycle. A skipped instance's
// slot is consumed, so the usable instances keep their relative shares.
// A retry or a hedge (tried not empty) takes its slots from a cursor of
// its own. From the first attempts' cursor it would take the next call's
// slot: with two instances, every first attempt would go to the same one.
func (p *picker) pickRoundRobin(tried []string) (int, error) {
	rr := &p.rr
	if rr.seq == nil {
		return p.pickSmooth(tried)
	}
	n := uint64(len(rr.seq))
	cursor := &rr.next
	if len(tried) > 0 {
		cursor = &rr.retry
	}
	for range min(n, rrTries) {
		k := cursor.Add(1) - 1
		if i := int(rr.seq[k%n]); p.usable(i, tried) {
			return i, nil
		}
	}
	return p.scanWeighted(tried)
}

// pickSmooth runs one step of smooth weighted round robin over the usable
// instances under the mutex.
func (p *picker) pickSmooth(tried []string) (int, error) {
	rr := &p.rr
	rr.mu.Lock()
	defer rr.mu.Unlock()
	best := -1
	var total int64
	for i := range p.ins {
		if !p.usable(i, tried) {
			continue
		}
		w := int64(p.weights[i])
		rr.cur[i] += w
		total += w
		if best < 0 || rr.cur[i] > rr.cur[best] {
			best = i
		}
	}
	if best < 0 {
		return -1, p.none(tried)
	}
	rr.cur[best] -= total
	return best, nil
}
