package main

import (
	"cmp"
	"slices"

	"github.com/dabbrpc/dabb/bench/frameworks"
)

// pointKey identifies one framework at one point of the sweep; the
// rounds of a point share it.
type pointKey struct {
	framework string
	payload   string
	c, large  int
}

func (p point) key() pointKey {
	return pointKey{framework: p.Framework, payload: p.Payload, c: p.C, large: p.Large}
}

// selectMedians marks, for each framework and point, the round with the
// median calls/s as the one reported (Median): the middle one for an odd
// count of rounds, the lower middle one for an even count. Rounds of
// equal calls/s rank by round. The whole window is reported, its
// latencies, CPU and system calls with its calls/s.
func selectMedians(pts []point) {
	groups := map[pointKey][]int{}
	for i := range pts {
		pts[i].Median = false
		k := pts[i].key()
		groups[k] = append(groups[k], i)
	}
	for _, idx := range groups {
		slices.SortStableFunc(idx, func(a, b int) int {
			if c := cmp.Compare(pts[a].rate(), pts[b].rate()); c != 0 {
				return c
			}
			return cmp.Compare(pts[a].Round, pts[b].Round)
		})
		pts[idx[(len(idx)-1)/2]].Median = true
	}
}

// rank returns where p sorts in the tables: by framework in -frameworks
// order, then by point in the order of a round, then by round.
func (res *results) rank(p point) (fw, pt, round int) {
	fw = slices.IndexFunc(res.cfg.frameworks, func(f frameworks.Framework) bool { return f.Name == p.Framework })
	pt = slices.IndexFunc(res.cfg.specs(), func(s spec) bool {
		return s.payload == p.Payload && s.c == p.C && s.large == p.Large
	})
	return fw, pt, p.Round
}

// sorted returns every window in table order (see rank).
func (res *results) sorted() []point {
	pts := slices.Clone(res.points)
	slices.SortStableFunc(pts, func(a, b point) int {
		fa, pa, ra := res.rank(a)
		fb, pb, rb := res.rank(b)
		return cmp.Or(cmp.Compare(fa, fb), cmp.Compare(pa, pb), cmp.Compare(ra, rb))
	})
	return pts
}

// medians returns the reported windows, one per framework and point, in
// table order.
func (res *results) medians() []point {
	var m []point
	for _, p := range res.sorted() {
		if p.Median {
			m = append(m, p)
		}
	}
	return m
}

// rounds returns every round of p's framework and point, by round.
func (res *results) rounds(p point) []point {
	var rs []point
	for _, q := range res.sorted() {
		if q.key() == p.key() {
			rs = append(rs, q)
		}
	}
	return rs
}

// roundErrors returns the errors of every round of p's framework and
// point together, and the first error message of the earliest round that
// had one, with that round.
func (res *results) roundErrors(p point) (n uint64, first string, round int) {
	for _, q := range res.rounds(p) {
		n += q.Errors
		if first == "" && q.FirstErr != "" {
			first, round = q.FirstErr, q.Round
		}
	}
	return n, first, round
}

// spread returns (max − min) ÷ median of the calls/s of p's rounds, 0
// with one round.
func (res *results) spread(p point) float64 {
	rs := res.rounds(p)
	if len(rs) < 2 || p.rate() == 0 {
		return 0
	}
	lo, hi := rs[0].rate(), rs[0].rate()
	for _, q := range rs[1:] {
		lo, hi = min(lo, q.rate()), max(hi, q.rate())
	}
	return (hi - lo) / p.rate()
}
