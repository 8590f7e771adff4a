// Consistent hashing: the same key goes to the same instance.

package balancer

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/dabbrpc/dabb/registry"
)

const (
	// vnodesPerDefault is the number of virtual nodes of an instance of
	// the lightest weight in the list. With equal weights every instance
	// has that many. Heavier ones get a proportional count, at most
	// maxVnodes: beyond a ratio of 16 the shares flatten.
	vnodesPerDefault = 160
	maxVnodes        = 16 * vnodesPerDefault
	// ringProbe is how many ring steps a pick walks past skipped
	// instances before it checks that some instance is usable at all.
	ringProbe = 32
)

// ring is a consistent hash ring. A virtual node's hash depends only on its
// instance's Addr and number. So removing an instance moves only the keys
// it owned. And every client that sees the same instances maps a key to
// the same one, in any process.
//
// Each entry packs a virtual node's position, the top 64−rankBits bits of
// its hash, with its instance's rank in (Addr, ID) order in the low
// rankBits bits. The ring then sorts as plain integers, and equal positions
// keep one order whatever the order of the list.
type ring struct {
	entries []uint64
	owners  []int32 // rank → index in the list
}

const (
	rankBits = 24
	rankMask = 1<<rankBits - 1
)

func (r *ring) init(ins []registry.Instance, weights []uint64) {
	// Instances past 1<<rankBits (far more than any service runs) stay
	// off the ring; the empty key still reaches them.
	n := min(len(ins), 1<<rankBits)
	r.owners = make([]int32, len(ins))
	for i := range r.owners {
		r.owners[i] = int32(i)
	}
	slices.SortFunc(r.owners, func(a, b int32) int {
		x, y := &ins[a], &ins[b]
		if c := cmp.Compare(x.Addr, y.Addr); c != 0 {
			return c
		}
		return cmp.Compare(x.ID, y.ID)
	})
	r.owners = r.owners[:n]
	var lo, hi uint64
	for k, i := range r.owners {
		if w := weights[i]; k == 0 {
			lo, hi = w, w
		} else {
			lo, hi = min(lo, w), max(hi, w)
		}
	}
	total := 0
	for _, i := range r.owners {
		total += vnodes(weights[i], lo, hi)
	}
	r.entries = make([]uint64, 0, total)
	for rank, i := range r.owners {
		for v := range vnodes(weights[i], lo, hi) {
			r.entries = append(r.entries, vnodeHash(ins[i].Addr, v)&^rankMask|uint64(rank))
		}
	}
	slices.Sort(r.entries)
}

// vnodes is the number of virtual nodes of an instance of weight w in a
// list whose weights range from lo to hi. Counts follow the weights'
// ratios, not their values: weights are shares. Ten instances of weight 1
// get a ring as even as ten of weight 100. A count changes only when the
// lightest weight of the list does (past the cap, the heaviest). So adding
// or removing an instance of other weights moves only its own keys.
func vnodes(w, lo, hi uint64) int {
	var c uint64
	if hi*vnodesPerDefault <= lo*maxVnodes {
		c = (w*vnodesPerDefault + lo/2) / lo
	} else {
		c = (w*maxVnodes + hi/2) / hi
	}
	return int(min(max(c, 1), maxVnodes))
}

// pickHash routes key to the first usable instance clockwise from its hash
// on the ring. The empty key has no affinity: it is routed by weighted
// random.
func (p *picker) pickHash(key string, tried []string) (int, error) {
	r := &p.ring
	n := len(r.entries)
	if key == "" || n == 0 {
		return p.pickWeighted(tried)
	}
	h := hashString(key) &^ rankMask
	lo, hi := 0, n
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if r.entries[m] >= h {
			hi = m
		} else {
			lo = m + 1
		}
	}
	pos := lo
	for step := range n {
		if pos == n {
			pos = 0
		}
		if step == ringProbe && !p.anyUsable(tried) {
			break
		}
		if i := int(r.owners[r.entries[pos]&rankMask]); p.usable(i, tried) {
			return i, nil
		}
		pos++
	}
	return -1, p.none(tried)
}

// FNV-1a, finished with a 64-bit mixer so that similar inputs (addresses
// differing in one digit, consecutive virtual node numbers) spread over the
// whole ring. Fixed constants: the ring is the same in every process.
const (
	fnvOffset = 14695981039346656037
	fnvPrime  = 1099511628211
)

func fnvString(h uint64, s string) uint64 {
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime
	}
	return h
}

func mix64(h uint64) uint64 {
	h ^= h >> 33
	h *= 0xff51afd7ed558ccd
	h ^= h >> 33
	h *= 0xc4ceb9fe1a85ec53
	h ^= h >> 33
	return h
}

func hashString(s string) uint64 { return mix64(fnvString(fnvOffset, s)) }

func vnodeHash(addr string, v int) uint64 {
	var buf [24]byte
	b := append(buf[:0], '#')
	b = strconv.AppendInt(b, int64(v), 10)
	h := fnvString(fnvOffset, addr)
	for _, c := range b {
		h ^= uint64(c)
		h *= fnvPrime
	}
	return mix64(h)
}
