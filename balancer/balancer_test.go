package balancer

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/dabbrpc/dabb/registry"
)

var allNames = []string{Random, RoundRobin, LeastActive, ConsistentHash, P2C}

// list returns instances i0, i1, ... of service "svc"; weights, when
// given, are the instances' weights in order.
func list(n int, weights ...int) []registry.Instance {
	ins := make([]registry.Instance, n)
	for i := range ins {
		ins[i] = registry.Instance{Service: "svc", ID: fmt.Sprintf("i%d", i), Addr: fmt.Sprintf("10.0.%d.%d:20880", i/250, i%250+1)}
		if i < len(weights) {
			ins[i].Weight = weights[i]
		}
	}
	return ins
}

// clock is a fake monotonic clock in nanoseconds.
type clock struct{ t atomic.Int64 }

func (c *clock) now() int64              { return c.t.Load() }
func (c *clock) advance(d time.Duration) { c.t.Add(int64(d)) }

// newSeeded builds a balancer whose random source has a fixed seed and
// whose clock is c. The source is not safe for concurrent picks.
func newSeeded(t testing.TB, name string, cfg Config, seed uint64, c *clock) *balancer {
	t.Helper()
	r := rand.New(rand.NewPCG(seed, seed^0x5eed))
	b, err := build(name, cfg, hooks{now: c.now, rand: r.Uint64})
	if err != nil {
		t.Fatalf("build(%q): %v", name, err)
	}
	return b
}

// newDefault builds a balancer with the real clock and random source.
func newDefault(t testing.TB, name string, cfg Config) *balancer {
	t.Helper()
	b, err := New(name, cfg)
	if err != nil {
		t.Fatalf("New(%q): %v", name, err)
	}
	return b.(*balancer)
}

// pick picks, reports success after lat and returns the instance.
func pick(t testing.TB, b Balancer, key string, lat time.Duration) registry.Instance {
	t.Helper()
	in, done, err := b.Pick(context.Background(), key)
	if err != nil {
		t.Fatalf("Pick(%q): %v", key, err)
	}
	done(lat, nil)
	return in
}

// keyFor returns the key of pick k for name: distinct keys for the
// consistent hash, none for the others.
func keyFor(name string, k int) string {
	if name == ConsistentHash {
		return fmt.Sprintf("key-%d", k)
	}
	return ""
}

func TestNew(t *testing.T) {
	tests := []struct {
		name     string
		cfg      Config
		wantKind kind
		wantErr  string
	}{
		{name: "", wantKind: kindP2C},
		{name: Random, wantKind: kindRandom},
		{name: RoundRobin, wantKind: kindRoundRobin},
		{name: LeastActive, wantKind: kindLeastActive},
		{name: ConsistentHash, wantKind: kindConsistentHash},
		{name: P2C, wantKind: kindP2C},
		{name: "weighted", wantErr: `unknown balancer "weighted" (valid: consistent_hash, least_active, p2c, random, round_robin)`},
		{name: P2C, cfg: Config{DecayTime: -time.Second}, wantErr: "negative DecayTime"},
		{name: P2C, cfg: Config{ErrorPenalty: -time.Second}, wantErr: "ErrorPenalty"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%q/%s", tt.name, tt.wantErr), func(t *testing.T) {
			b, err := New(tt.name, tt.cfg)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.HasPrefix(err.Error(), "balancer: ") {
					t.Fatalf("New(%q) error = %v, want one containing %q", tt.name, err, tt.wantErr)
				}
				if b != nil {
					t.Fatalf("New(%q) returned a balancer with its error", tt.name)
				}
				return
			}
			if err != nil {
				t.Fatalf("New(%q): %v", tt.name, err)
			}
			if got := b.(*balancer).kind; got != tt.wantKind {
				t.Fatalf("New(%q) kind = %d, want %d", tt.name, got, tt.wantKind)
			}
			if c := b.(*balancer).cfg; c.DecayTime != DefaultDecayTime || c.ErrorPenalty != DefaultErrorPenalty {
				t.Fatalf("New(%q) config defaults = %v, %v", tt.name, c.DecayTime, c.ErrorPenalty)
			}
		})
	}
}

// TestSkipping checks, for every balancer, that unavailable and excluded
// instances are never chosen, and the errors when nothing is left.
func TestSkipping(t *testing.T) {
	ins := list(5)
	addrs := func(idx ...int) []string {
		var s []string
		for _, i := range idx {
			s = append(s, ins[i].Addr)
		}
		return s
	}
	unavailable := func(idx ...int) func(*registry.Instance) bool {
		down := map[string]bool{}
		for _, a := range addrs(idx...) {
			down[a] = true
		}
		return func(in *registry.Instance) bool { return !down[in.Addr] }
	}
	tests := []struct {
		name    string
		list    []registry.Instance
		update  bool
		avail   func(*registry.Instance) bool
		tried   []string
		want    []string // the addresses picks may return, all of which must show up
		wantErr string   // when set, every pick fails with it
	}{
		{name: "all available", list: ins, update: true, want: addrs(0, 1, 2, 3, 4)},
		{name: "some unavailable", list: ins, update: true, avail: unavailable(0, 2, 4), want: addrs(1, 3)},
		{name: "one left", list: ins, update: true, avail: unavailable(0, 1, 2, 3), want: addrs(4)},
		{name: "excluded", list: ins, update: true, tried: addrs(0, 1, 3), want: addrs(2, 4)},
		{name: "excluded and unavailable", list: ins, update: true, avail: unavailable(2), tried: addrs(0, 1), want: addrs(3, 4)},
		{name: "unknown address excluded", list: ins, update: true, tried: []string{"10.9.9.9:1"}, want: addrs(0, 1, 2, 3, 4)},
		{name: "all unavailable", list: ins, update: true, avail: unavailable(0, 1, 2, 3, 4),
			wantErr: "balancer: no instance available: all 5 instances of svc are unavailable"},
		{name: "all excluded", list: ins, update: true, tried: addrs(0, 1, 2, 3, 4),
			wantErr: "balancer: no instance available: all 5 instances of svc are unavailable or already tried"},
		{name: "rest unavailable", list: ins, update: true, avail: unavailable(1, 2, 3, 4), tried: addrs(0),
			wantErr: "all 5 instances of svc are unavailable or already tried"},
		{name: "the only one unavailable", list: ins[:1], update: true, avail: unavailable(0),
			wantErr: "balancer: no instance available: the only instance of svc is unavailable"},
		{name: "the only one tried", list: ins[:1], update: true, tried: addrs(0),
			wantErr: "balancer: no instance available: the only instance of svc is unavailable or already tried"},
		{name: "empty list", list: nil, update: true, wantErr: "balancer: no instance available: the instance list is empty"},
		{name: "never updated", wantErr: "the instance list is empty"},
	}
	for _, name := range allNames {
		for _, tt := range tests {
			t.Run(name+"/"+tt.name, func(t *testing.T) {
				b := newSeeded(t, name, Config{Available: tt.avail}, 1, &clock{})
				if tt.update {
					b.Update(tt.list)
				}
				seen := map[string]int{}
				for k := range 400 {
					in, done, err := b.PickExcept(context.Background(), keyFor(name, k), tt.tried)
					if done == nil {
						t.Fatalf("pick %d: nil Done", k)
					}
					done(time.Millisecond, nil)
					if tt.wantErr != "" {
						if !errors.Is(err, ErrNoInstance) || !strings.Contains(err.Error(), tt.wantErr) {
							t.Fatalf("pick %d: error %v, want ErrNoInstance with %q", k, err, tt.wantErr)
						}
						if in.Addr != "" || in.ID != "" {
							t.Fatalf("pick %d: error %v came with instance %+v", k, err, in)
						}
						continue
					}
					if err != nil {
						t.Fatalf("pick %d: %v", k, err)
					}
					seen[in.Addr]++
				}
				if tt.wantErr != "" {
					return
				}
				for a := range seen {
					if !contains(tt.want, a) {
						t.Errorf("picked %s, want only %v (seen %v)", a, tt.want, seen)
					}
				}
				for _, a := range tt.want {
					if seen[a] == 0 {
						t.Errorf("%s never picked in 400 picks (seen %v)", a, seen)
					}
				}
			})
		}
	}
}

func contains(s []string, v string) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

// TestOddInstances feeds lists a registry might deliver from misconfigured
// servers: zero, negative and huge weights, duplicates, empty fields.
func TestOddInstances(t *testing.T) {
	odd := []registry.Instance{
		{ID: "a", Addr: "a:1", Weight: 0},
		{ID: "b", Addr: "b:1", Weight: -5},
		{ID: "c", Addr: "c:1", Weight: 1 << 62},
		{ID: "c", Addr: "c:1", Weight: 1 << 62},
		{ID: "", Addr: ""},
	}
	for _, name := range allNames {
		t.Run(name, func(t *testing.T) {
			b := newSeeded(t, name, Config{}, 2, &clock{})
			b.Update(odd)
			seen := map[string]bool{}
			for k := range 2000 {
				in := pick(t, b, keyFor(name, k), time.Millisecond)
				seen[in.ID] = true
			}
			if !seen["c"] {
				t.Fatalf("the heaviest instance was never picked: %v", seen)
			}
		})
	}
}

// TestUpdateWhilePicking runs picks on several goroutines while the list
// changes, the empty list included (run with -race).
func TestUpdateWhilePicking(t *testing.T) {
	lists := [][]registry.Instance{list(3), list(5, 50, 100, 200, 300, 400), nil, list(1), list(40)}
	valid := map[string]bool{}
	for _, l := range lists {
		for _, in := range l {
			valid[in.Addr] = true
		}
	}
	for _, name := range allNames {
		t.Run(name, func(t *testing.T) {
			var down atomic.Int64 // instances i0..i(down-1) unavailable
			index := map[string]int64{}
			for i := range 40 {
				index[fmt.Sprintf("i%d", i)] = int64(i)
			}
			avail := func(in *registry.Instance) bool { return index[in.ID] >= down.Load() }
			b := newDefault(t, name, Config{Available: avail})
			b.Update(lists[0])
			var stop atomic.Bool
			var attempts atomic.Int64
			var wg sync.WaitGroup
			errs := make(chan error, 4)
			for g := range 4 {
				wg.Go(func() {
					failed := false
					for k := 0; !stop.Load(); k++ {
						attempts.Add(1)
						in, done, err := b.PickExcept(context.Background(), keyFor(name, k), nil)
						done(time.Duration(k%7)*time.Millisecond, nil)
						var bad error
						switch {
						case err != nil && !errors.Is(err, ErrNoInstance):
							bad = fmt.Errorf("goroutine %d: %v", g, err)
						case err == nil && !valid[in.Addr]:
							bad = fmt.Errorf("goroutine %d: picked unknown instance %+v", g, in)
						}
						if bad != nil && !failed {
							failed = true
							errs <- bad
						}
					}
				})
			}
			// Keep updating until the pickers have run well into the
			// updates (they never stop on their own before stop is set).
			for u := 0; u < 300 || attempts.Load() < 4000; u++ {
				b.Update(lists[u%len(lists)])
				down.Store(int64(u % 3))
			}
			stop.Store(true)
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Error(err)
			}
		})
	}
}

// TestInflightReturnsToZero calls Done exactly once per Pick from many
// goroutines while the list changes; afterwards every instance state the
// balancer ever used counts zero calls in flight.
func TestInflightReturnsToZero(t *testing.T) {
	for _, name := range []string{LeastActive, P2C} {
		t.Run(name, func(t *testing.T) {
			b := newDefault(t, name, Config{})
			lists := [][]registry.Instance{list(4), list(8), list(2), nil}
			seen := map[*state]bool{}
			update := func(l []registry.Instance) {
				b.Update(l)
				for _, st := range b.cur.Load().states {
					seen[st] = true
				}
			}
			update(lists[0])
			var stop atomic.Bool
			var picks, dones atomic.Int64
			var wg sync.WaitGroup
			for g := range 6 {
				wg.Go(func() {
					var held []Done
					for !stop.Load() {
						_, done, err := b.Pick(context.Background(), "")
						if err != nil {
							continue
						}
						picks.Add(1)
						held = append(held, done)
						if len(held) > g { // hold up to g attempts in flight
							held[0](time.Millisecond, nil)
							dones.Add(1)
							held = held[1:]
						}
					}
					for _, d := range held {
						d(time.Millisecond, errors.New("late"))
						dones.Add(1)
					}
				})
			}
			for u := 0; u < 200 || picks.Load() < 3000; u++ {
				update(lists[u%len(lists)])
			}
			stop.Store(true)
			wg.Wait()
			if picks.Load() != dones.Load() || picks.Load() == 0 {
				t.Fatalf("picks %d, dones %d", picks.Load(), dones.Load())
			}
			for st := range seen {
				if n := st.inflight.Load(); n != 0 {
					t.Errorf("a state counts %d calls in flight after all finished", n)
				}
			}
			if len(seen) < 8 {
				t.Fatalf("saw only %d states", len(seen))
			}
		})
	}
}

// TestStateSurvivesUpdate checks that in-flight counts and latency
// estimates belong to the instance, not to the list.
func TestStateSurvivesUpdate(t *testing.T) {
	t.Run(LeastActive, func(t *testing.T) {
		b := newSeeded(t, LeastActive, Config{}, 3, &clock{})
		ins := list(2)
		b.Update(ins)
		first, done, err := b.Pick(context.Background(), "")
		if err != nil {
			t.Fatal(err)
		}
		// A new slice in another order, plus a new instance that is busy.
		b.Update([]registry.Instance{ins[1], ins[0]})
		for k := range 10 {
			if in := pick(t, b, "", 0); in.Addr == first.Addr {
				t.Fatalf("pick %d after Update chose %s, which still has a call in flight", k, in.Addr)
			}
		}
		done(0, nil)
		if n := b.states[stateKey{first.ID, first.Addr}].inflight.Load(); n != 0 {
			t.Fatalf("in flight after Done = %d", n)
		}
	})
	t.Run(P2C, func(t *testing.T) {
		c := &clock{}
		b := newSeeded(t, P2C, Config{}, 4, c)
		ins := list(3)
		b.Update(ins)
		slowAddr := ins[2].Addr
		for range 50 {
			in, done, _ := b.Pick(context.Background(), "")
			done(latencyOf(in.Addr, slowAddr, 200*time.Millisecond, time.Millisecond), nil)
		}
		b.Update(append([]registry.Instance{ins[2]}, ins[:2]...))
		slow := 0
		for range 300 {
			if in := pick(t, b, "", time.Millisecond); in.Addr == slowAddr {
				slow++
			}
		}
		if slow > 30 {
			t.Fatalf("after Update the slow instance took %d of 300 picks: its estimate was reset", slow)
		}
		if st := b.states[stateKey{ins[2].ID, ins[2].Addr}]; math64(st.ewma.Load()) < float64(100*time.Millisecond) {
			t.Fatalf("slow instance estimate after Update = %v", time.Duration(math64(st.ewma.Load())))
		}
	})
}

func math64(bits uint64) float64 { return math.Float64frombits(bits) }

func latencyOf(addr, slowAddr string, slow, fast time.Duration) time.Duration {
	if addr == slowAddr {
		return slow
	}
	return fast
}

// TestPickDoesNotAllocate checks the zero-allocation target of the pick
// path, retries included.
func TestPickDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	for _, name := range allNames {
		for _, n := range []int{10, 1000} {
			t.Run(fmt.Sprintf("%s/%d", name, n), func(t *testing.T) {
				b := newDefault(t, name, Config{Available: func(in *registry.Instance) bool { return in.ID != "i1" }})
				b.Update(list(n))
				tried := [3]string{"10.0.0.1:20880"}
				keys := [2]string{"user-1", "user-2"}
				k := 0
				allocs := testing.AllocsPerRun(200, func() {
					k++
					_, done, err := b.PickExcept(context.Background(), keys[k&1], tried[:1])
					if err != nil {
						t.Fatal(err)
					}
					done(time.Millisecond, nil)
				})
				if allocs != 0 {
					t.Fatalf("%v allocations per pick, want 0", allocs)
				}
			})
		}
	}
}

// TestStateSize: a state fills one cache line, so that the counters of two
// instances updated on different cores do not contend.
func TestStateSize(t *testing.T) {
	if n := unsafe.Sizeof(state{}); n != 64 {
		t.Fatalf("state is %d bytes, want 64", n)
	}
}

// TestMostUnavailable: with one usable instance among many, every balancer
// finds it (past its bounded random tries and ring walk).
func TestMostUnavailable(t *testing.T) {
	ins := list(300)
	for _, name := range allNames {
		t.Run(name, func(t *testing.T) {
			b := newSeeded(t, name, Config{Available: func(in *registry.Instance) bool { return in.ID == "i77" }}, 9, &clock{})
			b.Update(ins)
			for k := range 200 {
				if in := pick(t, b, keyFor(name, k), time.Millisecond); in.ID != "i77" {
					t.Fatalf("pick %d chose unavailable %s", k, in.ID)
				}
			}
		})
	}
}

// TestUpdateMergesStates: an Update of a list sorted by ID and Addr after
// one that was sorted takes the states of the instances that stay, shares
// one state among duplicates, gives a new one to each new key and forgets
// the keys gone; unsorted lists take the map path to the same result.
func TestUpdateMergesStates(t *testing.T) {
	for _, name := range []string{LeastActive, P2C} {
		t.Run(name, func(t *testing.T) {
			b := newSeeded(t, name, Config{}, 5, &clock{})
			ins := registry.SortedCopy(list(6)) // i0 … i5
			moved := ins[3]
			moved.Addr = "10.9.9.9:1" // i3 at another address: another key
			steps := []struct {
				what   string
				list   []registry.Instance
				sorted bool
			}{
				{"first", ins[:5], true},
				{"one gone, one new", []registry.Instance{ins[0], ins[1], ins[3], ins[4], ins[5]}, true},
				{"duplicates", []registry.Instance{ins[0], ins[1], ins[1], ins[3], moved, ins[4], ins[5], ins[5]}, true},
				{"duplicates gone, first and last gone", []registry.Instance{ins[1], ins[3], moved, ins[4]}, true},
				{"unsorted", []registry.Instance{ins[4], ins[0], moved, ins[1]}, false},
				{"sorted after unsorted", []registry.Instance{ins[0], ins[1], ins[2], moved}, true},
				{"empty", nil, true},
				{"after empty", ins[:2], true},
			}
			prev := map[stateKey]*state{}
			for _, s := range steps {
				b.Update(s.list)
				p := b.cur.Load()
				if p.sorted != s.sorted {
					t.Fatalf("%s: sorted = %v, want %v", s.what, p.sorted, s.sorted)
				}
				want := map[stateKey]*state{}
				for i, in := range p.ins {
					k := stateKey{in.ID, in.Addr}
					st := p.states[i]
					if st == nil {
						t.Fatalf("%s: no state for %v", s.what, k)
					}
					if w, ok := want[k]; ok && w != st {
						t.Fatalf("%s: duplicates of %v have two states", s.what, k)
					}
					if old, ok := prev[k]; ok && old != st {
						t.Fatalf("%s: %v stayed but got a new state", s.what, k)
					}
					if _, ok := prev[k]; !ok {
						for ok2, old := range prev {
							if old == st {
								t.Fatalf("%s: new %v got the state of %v", s.what, k, ok2)
							}
						}
					}
					want[k] = st
				}
				if !maps.Equal(b.states, want) {
					t.Fatalf("%s: states hold %d keys, want the %d of the list: %v", s.what, len(b.states), len(want), b.states)
				}
				prev = want
			}
		})
	}
}
