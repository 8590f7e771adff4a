// Weighted random.

package balancer

// rejectionTries is how many random draws a pick makes before it falls back
// to an exact scan of the usable instances. Rejection sampling keeps the
// weighted distribution exact; the scan bounds the work when most instances
// are skipped.
const rejectionTries = 4

// pickWeighted draws an instance with probability proportional to its
// weight among the usable ones.
func (p *picker) pickWeighted(tried []string) (int, error) {
	for range rejectionTries {
		if i := p.drawWeighted(); p.usable(i, tried) {
			return i, nil
		}
	}
	return p.scanWeighted(tried)
}

// drawWeighted draws an instance by weight, usable or not.
func (p *picker) drawWeighted() int {
	if p.uniform {
		return int(p.rand() % uint64(len(p.ins)))
	}
	r := p.rand() % p.total
	// The first index whose prefix sum exceeds r.
	lo, hi := 0, len(p.cum)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if p.cum[m] > r {
			hi = m
		} else {
			lo = m + 1
		}
	}
	return lo
}

// scanWeighted draws by weight among the usable instances in two passes.
// Availability may change between the passes; then it settles for the last
// usable instance it saw.
func (p *picker) scanWeighted(tried []string) (int, error) {
	var sum uint64
	for i := range p.ins {
		if p.usable(i, tried) {
			sum += p.weights[i]
		}
	}
	if sum == 0 {
		return -1, p.none(tried)
	}
	r := p.rand() % sum
	last := -1
	for i := range p.ins {
		if !p.usable(i, tried) {
			continue
		}
		if r < p.weights[i] {
			return i, nil
		}
		r -= p.weights[i]
		last = i
	}
	if last < 0 {
		return -1, p.none(tried)
	}
	return last, nil
}
