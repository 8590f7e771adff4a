package main

import (
	"fmt"
	"math/bits"
	"strings"
	"time"
)

// histogram counts durations in the buckets of the bench's hist package:
// exact below 128 ns, then 64 buckets per power of two. Its text form is
// hist's too: the exact maximum in nanoseconds, then "VALUE:COUNT" for
// each non-empty bucket, VALUE a duration in nanoseconds inside it.
type histogram struct {
	counts [nBuckets]uint64
	max    time.Duration
}

const (
	subBits  = 6
	sub      = 1 << subBits
	maxShift = 33
	nBuckets = (maxShift+2)*sub + 1
)

func index(v uint64) int {
	if v < 2*sub {
		return int(v)
	}
	shift := bits.Len64(v) - (subBits + 1)
	if shift > maxShift {
		return nBuckets - 1
	}
	return shift*sub + int(v>>uint(shift))
}

// value returns the middle of bucket i's range.
func value(i int) uint64 {
	if i < 2*sub {
		return uint64(i)
	}
	shift := i/sub - 1
	m := uint64(i - shift*sub)
	return m<<uint(shift) + (1<<uint(shift))/2
}

func (h *histogram) record(d time.Duration) {
	h.counts[index(uint64(max(d, 0)))]++
	h.max = max(h.max, d)
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.max = max(h.max, o.max)
}

func (h *histogram) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d", h.max.Nanoseconds())
	for i, c := range h.counts {
		if c > 0 {
			fmt.Fprintf(&b, " %d:%d", value(i), c)
		}
	}
	return b.String()
}
