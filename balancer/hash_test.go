// Tests of consistent hashing.

package balancer

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/dabbrpc/dabb/registry"
)

func TestConsistentHashStability(t *testing.T) {
	ins := list(10)
	keys := make([]string, 10000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	b := newSeeded(t, ConsistentHash, Config{}, 1, &clock{})
	b.Update(ins)
	before := owners(t, b, keys)

	per := map[string]int{}
	for _, a := range before {
		per[a]++
	}
	for _, in := range ins {
		if n := per[in.Addr]; n < 500 || n > 1700 {
			t.Errorf("%s owns %d of 10000 keys, want about 1000", in.Addr, n)
		}
	}

	removed := ins[3]
	rest := append(append([]registry.Instance(nil), ins[:3]...), ins[4:]...)
	b.Update(rest)
	after := owners(t, b, keys)
	moved := map[string]int{}
	for _, k := range keys {
		switch {
		case before[k] != removed.Addr && after[k] != before[k]:
			t.Fatalf("key %s moved from %s to %s though its owner stayed", k, before[k], after[k])
		case before[k] == removed.Addr:
			moved[after[k]]++
		}
	}
	total := per[removed.Addr]
	if len(moved) < 6 {
		t.Errorf("the removed instance's %d keys went to only %d instances: %v", total, len(moved), moved)
	}
	for a, n := range moved {
		if a == removed.Addr || n > total/2 {
			t.Errorf("%s received %d of the removed instance's %d keys", a, n, total)
		}
	}

	// Unavailable is the same as removed; back, and in another order, is
	// the same as before.
	b2 := newSeeded(t, ConsistentHash, Config{Available: func(in *registry.Instance) bool { return in.Addr != removed.Addr }}, 2, &clock{})
	b2.Update(ins)
	if got := owners(t, b2, keys); !equalMaps(got, after) {
		t.Error("an unavailable instance's keys went elsewhere than when it is removed")
	}
	shuffled := append([]registry.Instance(nil), ins...)
	rand.New(rand.NewPCG(1, 2)).Shuffle(len(shuffled), func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
	b.Update(shuffled)
	if got := owners(t, b, keys); !equalMaps(got, before) {
		t.Error("the same instances in another order own different keys")
	}
}

func TestConsistentHashWeights(t *testing.T) {
	b := newSeeded(t, ConsistentHash, Config{}, 1, &clock{})
	b.Update(list(2, 200, 100))
	per := map[string]int{}
	for i := range 20000 {
		per[pick(t, b, fmt.Sprintf("k%d", i), 0).ID]++
	}
	if r := float64(per["i0"]) / float64(per["i1"]); r < 1.5 || r > 2.6 {
		t.Fatalf("weight 200 vs 100 owns %v, ratio %.2f, want about 2", per, r)
	}
}

func TestConsistentHashEmptyKeyIsRandom(t *testing.T) {
	b := newSeeded(t, ConsistentHash, Config{}, 1, &clock{})
	b.Update(list(4))
	for id, s := range shares(t, b, 8000) {
		if math.Abs(s-0.25) > 0.03 {
			t.Errorf("empty key: %s share %.3f, want 0.25 ± 0.03", id, s)
		}
	}
	same := pick(t, b, "user-1", 0)
	for range 20 {
		if in := pick(t, b, "user-1", 0); in.Addr != same.Addr {
			t.Fatalf("key user-1 went to %s then %s", same.Addr, in.Addr)
		}
	}
}

// TestConsistentHashWeightsAreShares: the ring follows the weights'
// ratios, not their values: weight 1 everywhere is as even as the
// default, and large weights keep their proportions.
func TestConsistentHashWeightsAreShares(t *testing.T) {
	keys := make([]string, 20000)
	for i := range keys {
		keys[i] = fmt.Sprintf("user-%d", i)
	}
	shares := func(ins []registry.Instance) map[string]int {
		b := newSeeded(t, ConsistentHash, Config{}, 1, &clock{})
		b.Update(ins)
		per := map[string]int{}
		for _, k := range keys {
			per[pick(t, b, k, 0).ID]++
		}
		return per
	}
	for _, tc := range []struct {
		weights []int
		want    float64 // i1's keys ÷ i0's
	}{{[]int{1, 3}, 3}, {[]int{2000, 8000}, 4}, {[]int{100, 300}, 3}} {
		per := shares(list(2, tc.weights...))
		if r := float64(per["i1"]) / float64(per["i0"]); r < tc.want*0.75 || r > tc.want*1.3 {
			t.Errorf("weights %v own %v: ratio %.2f, want about %v", tc.weights, per, r, tc.want)
		}
	}
	ones := make([]int, 10)
	for i := range ones {
		ones[i] = 1
	}
	for id, n := range shares(list(10, ones...)) {
		if n < 1000 || n > 3400 {
			t.Errorf("with weight 1 everywhere %s owns %d of 20000 keys, want about 2000", id, n)
		}
	}
}

// owners maps each key to the address that owns it.
func owners(t *testing.T, b Balancer, keys []string) map[string]string {
	t.Helper()
	m := make(map[string]string, len(keys))
	for _, k := range keys {
		m[k] = pick(t, b, k, 0).Addr
	}
	return m
}

func equalMaps(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}
