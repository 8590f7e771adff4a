// Tests of smooth weighted round robin.

package balancer

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

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
