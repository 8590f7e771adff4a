// Least active: the instance with the fewest calls in flight.

package balancer

import "math/bits"

// pickLeastActive chooses a usable instance with the fewest calls in
// flight. Among those it takes the heaviest, and among those one at
// random. One pass does it all, with reservoir sampling for the tie.
func (p *picker) pickLeastActive(tried []string) (int, error) {
	best, ties := -1, uint64(0)
	var bestActive int64
	var bestWeight uint64
	s := p.rand()
	for i := range p.ins {
		a, w := p.states[i].inflight.Load(), p.weights[i]
		// Availability is asked only of instances that could win.
		switch {
		case best >= 0 && (a > bestActive || (a == bestActive && w < bestWeight)):
			continue
		case !p.usable(i, tried):
			continue
		case best < 0 || a < bestActive || w > bestWeight:
			best, bestActive, bestWeight, ties = i, a, w, 1
		default: // a tie
			ties++
			var r uint64
			s, r = splitmix(s)
			if hi, _ := bits.Mul64(r, ties); hi == 0 { // probability 1/ties
				best = i
			}
		}
	}
	if best < 0 {
		return -1, p.none(tried)
	}
	return best, nil
}

// splitmix advances a splitmix64 generator: it returns the new state and
// the next output.
func splitmix(s uint64) (next, out uint64) {
	s += 0x9e3779b97f4a7c15
	z := s
	z = (z ^ z>>30) * 0xbf58476d1ce4e5b9
	z = (z ^ z>>27) * 0x94d049bb133111eb
	return s, z ^ z>>31
}
