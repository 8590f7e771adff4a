// Power of two choices over EWMA latency, the default balancer.

package balancer

import (
	"math"
	"time"
)

// The p2c balancer draws two distinct usable instances at random and takes
// the cheaper, where
//
//	cost = latency estimate × (calls in flight + 1) / weight
//
// The latency estimate is a peak-sensitive, time-decayed moving average:
//
//   - an answer slower than the estimate replaces it at once (a slow
//     instance is avoided from its first slow answer);
//   - a faster answer is blended in with weight 1 − e^(−Δt/DecayTime), Δt
//     being the time since the previous answer, so the estimate falls over
//     a few DecayTimes whatever the call rate;
//   - a failed attempt counts as at least ErrorPenalty, so an instance that
//     fails fast does not look fast;
//   - while an instance has no call in flight its estimate is read decayed
//     towards zero for the time since its last answer: an instance that was
//     avoided because it was slow is probed again after a while, and its
//     answer then updates the estimate. While the probe is in flight the
//     undecayed estimate applies, so it is not flooded meanwhile;
//   - an instance that has never answered costs nothing while idle and a
//     prohibitive probeCost per call in flight, so it is probed with one
//     call at a time until its first answer and not flooded.
//
// The estimate and the in-flight count belong to the instance (ID and
// Addr), not to the list: they survive Update.

// unobserved is the estimate of an instance that has not answered yet.
var unobserved = math.Float64bits(-1)

// probeCost is the estimate charged per call in flight to an instance that
// has not answered yet.
const probeCost = float64(time.Hour)

// minLatency is the least latency an answer counts as.
const minLatency = float64(time.Microsecond)

// p2cTries is how many random pairs a pick draws before it falls back to a
// scan of the usable instances.
const p2cTries = 3

// observe folds one attempt into the estimate. clock reads the clock; it is
// not called for an answer that is skipped.
func (st *state) observe(latency float64, failed bool, penalty, tau float64, clock func() int64) {
	// A zero estimate would make the count in flight irrelevant.
	latency = max(latency, minLatency)
	if failed && latency < penalty {
		latency = penalty
	}
	if failed {
		st.mu.Lock()
	} else if !st.mu.TryLock() {
		// Another answer is being folded in right now: the instance is
		// busy, and one answer more or less moves its estimate little.
		// Waiting for the lock on every call would serialise the callers.
		return
	}
	defer st.mu.Unlock()
	now := clock()
	v := latency
	if prev := math.Float64frombits(st.ewma.Load()); prev >= 0 {
		w := 1.0
		if td := now - st.stamp.Load(); td > 0 {
			w = decay(float64(td) / tau)
		}
		if decayed := prev * w; latency <= decayed {
			v = decayed + latency*(1-w)
		}
	}
	st.stamp.Store(now)
	st.ewma.Store(math.Float64bits(v))
}

// decay returns e^(−x) for x ≥ 0. Between answers of a busy instance x is
// tiny, and a short series is exact to within 1e-10 and several times
// cheaper than math.Exp.
func decay(x float64) float64 {
	if x < 1e-2 {
		return 1 - x*(1-x*(0.5-x/6))
	}
	return math.Exp(-x)
}

// lazyNow reads the clock at most once per pick, and only if needed.
type lazyNow struct {
	t  int64
	ok bool
}

func (l *lazyNow) get(now func() int64) int64 {
	if !l.ok {
		l.t, l.ok = now(), true
	}
	return l.t
}

// cost is instance i's cost now (see the comment at the top).
func (p *picker) cost(i int, now *lazyNow) float64 {
	st := p.states[i]
	active := max(st.inflight.Load(), 0)
	e := math.Float64frombits(st.ewma.Load())
	switch {
	case e < 0:
		if active == 0 {
			return 0
		}
		e = probeCost
	case active == 0:
		if td := now.get(p.now) - st.stamp.Load(); td > 0 {
			e *= decay(float64(td) / p.tau)
		}
	}
	return e * float64(active+1) / float64(p.weights[i])
}

// cheaper returns the cheaper of i and j, i on a tie.
func (p *picker) cheaper(i, j int) int {
	var now lazyNow
	if p.cost(j, &now) < p.cost(i, &now) {
		return j
	}
	return i
}

// below returns a uniform random integer in [0, n) from 32 random bits.
func below(r uint32, n int) int { return int(uint64(r) * uint64(n) >> 32) }

func (p *picker) pickP2C(tried []string) (int, error) {
	n := len(p.ins)
	if n == 1 {
		if p.usable(0, tried) {
			return 0, nil
		}
		return -1, p.none(tried)
	}
	for range p2cTries {
		r := p.rand()
		i := below(uint32(r), n)
		j := below(uint32(r>>32), n-1)
		if j >= i {
			j++
		}
		if p.usable(i, tried) && p.usable(j, tried) {
			return p.cheaper(i, j), nil
		}
	}
	return p.scanP2C(tried)
}

// scanP2C draws two distinct instances uniformly among the usable ones (or
// takes the only one). Availability may change between its passes; then it
// settles for what it found.
func (p *picker) scanP2C(tried []string) (int, error) {
	k := 0
	for i := range p.ins {
		if p.usable(i, tried) {
			k++
		}
	}
	if k == 0 {
		return -1, p.none(tried)
	}
	r := p.rand()
	a, b := below(uint32(r), k), -1
	if k > 1 {
		if b = below(uint32(r>>32), k-1); b >= a {
			b++
		}
	}
	i, j, last, rank := -1, -1, -1, 0
	for x := range p.ins {
		if !p.usable(x, tried) {
			continue
		}
		switch rank {
		case a:
			i = x
		case b:
			j = x
		}
		rank++
		last = x
	}
	switch {
	case i >= 0 && j >= 0:
		return p.cheaper(i, j), nil
	case i >= 0:
		return i, nil
	case j >= 0:
		return j, nil
	case last >= 0:
		return last, nil
	}
	return -1, p.none(tried)
}
