// Tests of power of two choices.

package balancer

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"
)

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

// TestP2CObserveNeverWaitsOnSuccess: an answer folded in while another is
// (the estimate's lock held) is skipped rather than waited for, so callers
// of a busy instance do not queue on its lock; a failure still waits and
// counts.
func TestP2CObserveNeverWaitsOnSuccess(t *testing.T) {
	c := &clock{}
	b := newSeeded(t, P2C, Config{}, 13, c)
	b.Update(list(1))
	_, done, err := b.Pick(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	st := b.cur.Load().states[0]
	st.mu.Lock()
	finished := make(chan struct{})
	go func() {
		done(time.Millisecond, nil)
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(5 * time.Second):
		st.mu.Unlock()
		t.Fatal("a successful answer waited for the estimate's lock")
	}
	if e := math.Float64frombits(st.ewma.Load()); e >= 0 {
		t.Fatalf("the skipped answer set the estimate to %v", e)
	}
	_, done, err = b.Pick(context.Background(), "")
	if err != nil {
		t.Fatal(err)
	}
	failed := make(chan struct{})
	go func() {
		done(time.Millisecond, errors.New("refused"))
		close(failed)
	}()
	st.mu.Unlock()
	<-failed
	if e := math.Float64frombits(st.ewma.Load()); e < float64(time.Millisecond) {
		t.Fatalf("the failure was not folded in: estimate %v", e)
	}
}
