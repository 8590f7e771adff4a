package balancer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
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

// letters names instances a, b, c, ... for sequence checks.
func letters(ins []registry.Instance) func(registry.Instance) string {
	m := map[string]string{}
	for i, in := range ins {
		m[in.Addr] = string(rune('a' + i))
	}
	return func(in registry.Instance) string { return m[in.Addr] }
}

// forceMutexPath switches a round robin picker to the O(n) path under its
// mutex, as for a cycle too long to precompute.
func forceMutexPath(b *balancer) {
	p := b.cur.Load()
	p.rr.seq = nil
	p.rr.cur = make([]int64, len(p.ins))
}

func TestSmoothRoundRobinSequence(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
		down    string // the letter of an unavailable instance, if any
		want    string // two cycles
	}{
		{name: "nginx 5 1 1", weights: []int{5, 1, 1}, want: "aabacaa" + "aabacaa"},
		{name: "equal", weights: []int{100, 100, 100}, want: "abc" + "abc"},
		{name: "gcd reduced", weights: []int{200, 100}, want: "aba" + "aba"},
		{name: "4 2 1", weights: []int{4, 2, 1}, want: "abacaba" + "abacaba"},
		{name: "c unavailable", weights: []int{5, 1, 1}, down: "c", want: "aabaa" + "a" + "aabaa" + "a"},
	}
	for _, mutex := range []bool{false, true} {
		for _, tt := range tests {
			path := "precomputed"
			if mutex {
				path = "mutex"
			}
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				ins := list(len(tt.weights), tt.weights...)
				name := letters(ins)
				cfg := Config{Available: func(in *registry.Instance) bool { return name(*in) != tt.down }}
				b, err := build(RoundRobin, cfg, hooks{now: (&clock{}).now, rand: func() uint64 { return 0 }})
				if err != nil {
					t.Fatal(err)
				}
				b.Update(ins)
				if mutex {
					forceMutexPath(b)
				}
				var got strings.Builder
				for range len(tt.want) {
					got.WriteString(name(pick(t, b, "", 0)))
				}
				if tt.down == "" && got.String() != tt.want {
					t.Fatalf("sequence %q, want %q", got.String(), tt.want)
				}
				if tt.down != "" {
					// Skipping consumes the skipped slot: over whole cycles
					// the others keep their relative shares exactly.
					if n := strings.Count(got.String(), tt.down); n != 0 {
						t.Fatalf("sequence %q contains unavailable %s", got.String(), tt.down)
					}
					a, bb := strings.Count(got.String(), "a"), strings.Count(got.String(), "b")
					if a != 10 || bb != 2 {
						t.Fatalf("sequence %q: a %d times, b %d, want 10 and 2", got.String(), a, bb)
					}
				}
			})
		}
	}
}

// TestRoundRobinLongCycle checks weights whose cycle is too long to
// precompute: picks take the mutex path and still follow the weights.
func TestRoundRobinLongCycle(t *testing.T) {
	ins := list(2, 70001, 30001)
	b := newSeeded(t, RoundRobin, Config{}, 1, &clock{})
	b.Update(ins)
	if b.cur.Load().rr.seq != nil {
		t.Fatal("a cycle of 100002 was precomputed")
	}
	got := shares(t, b, 1000)
	if n := got["i0"] * 1000; math.Abs(n-700) > 2 {
		t.Fatalf("i0 chosen %v times in 1000, want 700 ± 2", n)
	}
}

// TestRoundRobinManyInstances: with equal weights a full cycle is one pick
// per instance.
func TestRoundRobinManyInstances(t *testing.T) {
	b := newSeeded(t, RoundRobin, Config{}, 5, &clock{})
	b.Update(list(1000))
	count := map[string]int{}
	for range 3000 {
		count[pick(t, b, "", 0).Addr]++
	}
	for a, n := range count {
		if n != 3 {
			t.Fatalf("%s chosen %d times in 3 cycles, want 3", a, n)
		}
	}
	if len(count) != 1000 {
		t.Fatalf("%d instances chosen, want 1000", len(count))
	}
}

func TestLeastActive(t *testing.T) {
	ctx := context.Background()
	t.Run("spreads calls in flight", func(t *testing.T) {
		b := newSeeded(t, LeastActive, Config{}, 1, &clock{})
		b.Update(list(3))
		count := map[string]int{}
		var held []Done
		for range 9 {
			in, done, err := b.Pick(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			count[in.ID]++
			held = append(held, done)
		}
		for id, n := range count {
			if n != 3 {
				t.Fatalf("%s holds %d of 9 calls in flight, want 3 each: %v", id, n, count)
			}
		}
		for _, d := range held {
			d(0, nil)
		}
	})
	t.Run("prefers fewer in flight", func(t *testing.T) {
		b := newSeeded(t, LeastActive, Config{}, 1, &clock{})
		ins := list(3)
		b.Update(ins)
		busy := map[string]int64{"i0": 2, "i1": 1}
		for _, in := range ins {
			b.states[stateKey{in.ID, in.Addr}].inflight.Store(busy[in.ID])
		}
		for k := range 50 {
			if in := pick(t, b, "", 0); in.ID != "i2" {
				t.Fatalf("pick %d chose %s, want the idle i2", k, in.ID)
			}
		}
	})
	t.Run("ties broken by weight", func(t *testing.T) {
		b := newSeeded(t, LeastActive, Config{}, 1, &clock{})
		b.Update(list(3, 100, 300, 100))
		for k := range 50 {
			if in := pick(t, b, "", 0); in.ID != "i1" {
				t.Fatalf("pick %d chose %s, want the heaviest idle i1", k, in.ID)
			}
		}
	})
	t.Run("then randomly", func(t *testing.T) {
		b := newSeeded(t, LeastActive, Config{}, 1, &clock{})
		b.Update(list(4))
		for id, s := range shares(t, b, 8000) {
			if math.Abs(s-0.25) > 0.03 {
				t.Errorf("%s share %.3f, want 0.25 ± 0.03", id, s)
			}
		}
	})
}

// runP2C picks n times, reporting each attempt with the latency and error
// of outcome, advancing the clock by step before each pick, and returns how
// often each ID was chosen.
func runP2C(t *testing.T, b *balancer, c *clock, n int, step time.Duration, outcome func(id string) (time.Duration, error)) map[string]int {
	t.Helper()
	count := map[string]int{}
	for range n {
		c.advance(step)
		in, done, err := b.Pick(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		count[in.ID]++
		done(outcome(in.ID))
	}
	return count
}

func TestP2CAvoidsSlowAndRecovers(t *testing.T) {
	c := &clock{}
	c.advance(time.Hour)
	b := newSeeded(t, P2C, Config{}, 11, c)
	b.Update(list(3))
	slow := true
	outcome := func(id string) (time.Duration, error) {
		if id == "i2" && slow {
			return 200 * time.Millisecond, nil
		}
		return time.Millisecond, nil
	}
	runP2C(t, b, c, 100, time.Millisecond, outcome) // warm-up
	got := runP2C(t, b, c, 2000, time.Millisecond, outcome)
	if got["i2"] > 200 {
		t.Fatalf("slow i2 took %d of 2000 picks, want <= 10%%: %v", got["i2"], got)
	}
	if got["i0"] < 600 || got["i1"] < 600 {
		t.Fatalf("fast instances unevenly used: %v", got)
	}

	// i2 is fast again. It is probed once its estimate has decayed below
	// the others' (about DecayTime × ln 200 ≈ 53 s) and then shares evenly.
	slow = false
	got = runP2C(t, b, c, 1000, 10*time.Millisecond, outcome) // 10 s
	if got["i2"] > 100 {
		t.Fatalf("i2 took %d of 1000 picks within 10 s of turning fast: its estimate decayed too quickly", got["i2"])
	}
	runP2C(t, b, c, 6000, 10*time.Millisecond, outcome) // 60 s more
	got = runP2C(t, b, c, 3000, 10*time.Millisecond, outcome)
	if got["i2"] < 600 {
		t.Fatalf("recovered i2 took %d of 3000 picks, want >= 20%%: %v", got["i2"], got)
	}
}

func TestP2CPenalisesErrors(t *testing.T) {
	fail := errors.New("connection refused")
	tests := []struct {
		name      string
		err       error
		min, max  int // i2's picks out of 3000
		configure Config
	}{
		{name: "fast failures penalised", err: fail, max: 300},
		{name: "fast successes attract traffic", err: nil, min: 1500},
		{name: "penalty below normal latency", err: fail, min: 1500, configure: Config{ErrorPenalty: time.Microsecond}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &clock{}
			b := newSeeded(t, P2C, tt.configure, 12, c)
			b.Update(list(3))
			outcome := func(id string) (time.Duration, error) {
				if id == "i2" {
					return 100 * time.Microsecond, tt.err
				}
				return 5 * time.Millisecond, nil
			}
			runP2C(t, b, c, 100, time.Millisecond, outcome)
			got := runP2C(t, b, c, 3000, time.Millisecond, outcome)
			if got["i2"] < tt.min || (tt.max > 0 && got["i2"] > tt.max) {
				t.Fatalf("i2 took %d of 3000 picks, want in [%d, %d]: %v", got["i2"], tt.min, tt.max, got)
			}
		})
	}
}

// TestP2CNewInstance: an instance that has not answered yet is probed with
// one call at a time, not flooded.
func TestP2CNewInstance(t *testing.T) {
	c := &clock{}
	b := newSeeded(t, P2C, Config{}, 13, c)
	ins := list(4)
	b.Update(ins[:3])
	runP2C(t, b, c, 300, time.Millisecond, func(string) (time.Duration, error) { return time.Millisecond, nil })
	b.Update(ins)
	var held []Done
	count := map[string]int{}
	for range 40 {
		in, done, err := b.Pick(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		count[in.ID]++
		held = append(held, done)
	}
	if count["i3"] != 1 {
		t.Fatalf("new i3 took %d of 40 concurrent calls, want exactly one probe: %v", count["i3"], count)
	}
	for _, d := range held {
		d(time.Millisecond, nil)
	}
	got := runP2C(t, b, c, 3000, time.Millisecond, func(string) (time.Duration, error) { return time.Millisecond, nil })
	if got["i3"] < 400 {
		t.Fatalf("i3 took %d of 3000 picks after answering fast, want a fair share: %v", got["i3"], got)
	}
}

// TestP2CPrefersLessLoaded: with equal latency, calls in flight decide.
func TestP2CPrefersLessLoaded(t *testing.T) {
	c := &clock{}
	b := newSeeded(t, P2C, Config{}, 14, c)
	ins := list(2)
	b.Update(ins)
	runP2C(t, b, c, 100, time.Millisecond, func(string) (time.Duration, error) { return time.Millisecond, nil })
	b.states[stateKey{"i0", ins[0].Addr}].inflight.Store(5)
	for k := range 20 {
		if in := pick(t, b, "", time.Millisecond); in.ID != "i1" {
			t.Fatalf("pick %d chose %s with 5 calls in flight over idle i1", k, in.ID)
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

// TestRoundRobinRetryKeepsTheRotation: a retry or a hedge (PickExcept)
// does not take the next call's slot. With two instances, calls that each
// make a second attempt used to start on the same instance every time.
func TestRoundRobinRetryKeepsTheRotation(t *testing.T) {
	b := newSeeded(t, RoundRobin, Config{}, 3, &clock{})
	b.Update(list(2))
	first := map[string]int{}
	for range 10 {
		in, done, err := b.Pick(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		done(time.Millisecond, nil)
		first[in.ID]++
		other, done2, err := b.PickExcept(context.Background(), "", []string{in.Addr})
		if err != nil {
			t.Fatal(err)
		}
		done2(time.Millisecond, nil)
		if other.ID == in.ID {
			t.Fatalf("PickExcept chose the excluded %s", in.ID)
		}
	}
	if first["i0"] != 5 || first["i1"] != 5 {
		t.Fatalf("first attempts went %v, want 5 and 5", first)
	}
}
