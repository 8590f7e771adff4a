// Tests of weighted random, and of the shares random and round robin give.

package balancer

import (
	"math"
	"testing"
	"time"
)

// shares picks n times (Done at once with lat) and returns the share of
// each instance ID.
func shares(t *testing.T, b Balancer, n int) map[string]float64 {
	t.Helper()
	count := map[string]int{}
	for range n {
		count[pick(t, b, "", time.Millisecond).ID]++
	}
	s := map[string]float64{}
	for id, c := range count {
		s[id] = float64(c) / float64(n)
	}
	return s
}

func TestWeightedShares(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
	}{
		{"equal", []int{100, 100, 100, 100}},
		{"default weight", []int{0, 100, 200}},
		{"skewed", []int{100, 200, 700}},
		{"small", []int{1, 3}},
	}
	for _, name := range []string{Random, RoundRobin} {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				ins := list(len(tt.weights), tt.weights...)
				b := newSeeded(t, name, Config{}, 7, &clock{})
				b.Update(ins)
				got := shares(t, b, 60000)
				var total float64
				for _, in := range ins {
					total += float64(in.EffectiveWeight())
				}
				for _, in := range ins {
					want := float64(in.EffectiveWeight()) / total
					if d := math.Abs(got[in.ID] - want); d > 0.01 {
						t.Errorf("%s share = %.4f, want %.4f ± 0.01", in.ID, got[in.ID], want)
					}
				}
			})
		}
	}
}
