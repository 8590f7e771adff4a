// Package bufpool keeps large byte buffers for reuse, so a stream of large
// messages does not allocate (and zero) a new body for every frame.
//
// Buffers come in power-of-two size classes from [Min] to [Max]:
//
//	b := bufpool.Get(n) // len n, cap the class size ≥ n
//	...
//	bufpool.Put(b) // only when nothing refers to b any more
//
// Requests under Min are plain allocations (small buffers are cheap and
// are pooled by their owners); over Max they are plain allocations too,
// and Put drops them.
package bufpool

import (
	"math/bits"
	"sync"
	"sync/atomic"
)

const (
	minShift = 16 // 64 KiB
	maxShift = 24 // 16 MiB
	// Min is the smallest buffer kept: 64 KiB.
	Min = 1 << minShift
	// Max is the largest buffer kept: 16 MiB, above the default body
	// limit of 8 MiB plus its header.
	Max = 1 << maxShift
)

// MaxKept is the largest buffer an owner keeps for its own next use (a
// pooled message, request or connection writer): one large frame must not
// pin megabytes to it for good. Larger buffers go back to this pool once
// their owner is done with them.
const MaxKept = 256 << 10

// pools[i] holds buffers whose capacity is at least 1<<(minShift+i).
var pools [maxShift - minShift + 1]sync.Pool

// boxes holds empty *[]byte, so that Put needs no new one: sync.Pool
// takes a pointer, and a slice header put as it is would be boxed.
var boxes = sync.Pool{New: func() any { return new([]byte) }}

// out counts the pooled-range buffers Get handed out minus those Put took.
var out atomic.Int64

// Outstanding returns how many buffers of Min to Max bytes Get has handed
// out and Put has not taken back. Tests read it to find a large buffer that
// never went back; a Put of a buffer Get did not make lowers it.
func Outstanding() int64 { return out.Load() }

// Get returns a buffer of length n. For n in [Min, Max] its capacity is the
// power of two at or above n and it may come from the pool, holding old
// bytes: the caller overwrites what it uses.
func Get(n int) []byte {
	if n < Min || n > Max {
		return make([]byte, n)
	}
	shift := bits.Len(uint(n - 1)) // smallest s with 1<<s >= n
	out.Add(1)
	if p, ok := pools[shift-minShift].Get().(*[]byte); ok {
		b := (*p)[:n]
		*p = nil
		boxes.Put(p)
		return b
	}
	return make([]byte, n, 1<<shift)
}

// Put offers b for reuse. Buffers with a capacity under Min are ignored;
// over Max they are dropped. The caller must not touch b afterwards.
func Put(b []byte) {
	c := cap(b)
	if c < Min || c > Max {
		return
	}
	shift := bits.Len(uint(c)) - 1 // largest s with 1<<s <= c
	out.Add(-1)
	p := boxes.Get().(*[]byte)
	*p = b[:0]
	pools[shift-minShift].Put(p)
}
