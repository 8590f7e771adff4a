// Package hist is a latency histogram with log-linear buckets: exact below
// 128 ns, then 64 buckets per power of two (under 1.6% error), up to about
// 18 minutes. Recording is an index computation and an increment; one
// histogram per goroutine, merged at the end, needs no locks.
//
//	var h hist.Histogram
//	h.Record(time.Since(start))
//	total.Merge(&h)
//	p99 := total.Quantile(0.99)
package hist

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

const (
	subBits  = 6
	sub      = 1 << subBits // buckets per power of two
	maxShift = 33           // values up to 2^40 ns
	nBuckets = (maxShift+2)*sub + 1
)

// Histogram counts durations. The zero value is empty and ready to use; it
// is not safe for concurrent use.
type Histogram struct {
	counts [nBuckets]uint64
	n      uint64
	max    time.Duration
}

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

// Record adds one duration; negative ones count as zero.
func (h *Histogram) Record(d time.Duration) {
	v := uint64(0)
	if d > 0 {
		v = uint64(d)
	}
	h.counts[index(v)]++
	h.n++
	if d > h.max {
		h.max = d
	}
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o *Histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.max = max(h.max, o.max)
}

// Reset empties h.
func (h *Histogram) Reset() { *h = Histogram{} }

// Count returns the number of durations recorded.
func (h *Histogram) Count() uint64 { return h.n }

// Max returns the largest duration recorded, exactly.
func (h *Histogram) Max() time.Duration { return h.max }

// Quantile returns the duration below which a fraction q of the recorded
// ones lie (q in [0, 1]), to the histogram's precision; 0 when empty.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	rank := uint64(q*float64(h.n) + 0.5)
	rank = min(max(rank, 1), h.n)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return min(time.Duration(value(i)), h.max)
		}
	}
	return h.max
}

// MarshalText writes h in its text form: the exact maximum in
// nanoseconds, then "VALUE:COUNT" for each non-empty bucket, VALUE a
// duration in nanoseconds inside the bucket (its middle), all separated
// by spaces. A process that records latencies in these buckets hands
// them to another in this form (bench/dubbogo's program writes it).
func (h *Histogram) MarshalText() ([]byte, error) {
	b := strconv.AppendInt(nil, int64(h.max), 10)
	for i, c := range h.counts {
		if c > 0 {
			b = append(b, ' ')
			b = strconv.AppendUint(b, value(i), 10)
			b = append(b, ':')
			b = strconv.AppendUint(b, c, 10)
		}
	}
	return b, nil
}

// UnmarshalText sets h to the histogram of MarshalText's form: each
// VALUE's COUNT goes to the bucket of VALUE, and the maximum is the one
// given.
func (h *Histogram) UnmarshalText(text []byte) error {
	f := strings.Fields(string(text))
	if len(f) == 0 {
		return errors.New("hist: empty text")
	}
	var n Histogram
	m, err := strconv.ParseInt(f[0], 10, 64)
	if err != nil || m < 0 {
		return fmt.Errorf("hist: maximum %q is not a duration in nanoseconds", f[0])
	}
	n.max = time.Duration(m)
	for _, p := range f[1:] {
		vs, cs, ok := strings.Cut(p, ":")
		v, verr := strconv.ParseUint(vs, 10, 64)
		c, cerr := strconv.ParseUint(cs, 10, 64)
		if !ok || verr != nil || cerr != nil {
			return fmt.Errorf("hist: %q is not VALUE:COUNT", p)
		}
		n.counts[index(v)] += c
		n.n += c
	}
	*h = n
	return nil
}
