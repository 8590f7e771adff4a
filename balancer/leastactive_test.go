// Tests of least active.

package balancer

import (
	"context"
	"math"
	"testing"
)

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
