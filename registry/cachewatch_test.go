package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"go.uber.org/goleak"
)

// reachRegistry is a hangingRegistry whose client knows whether it can
// reach the registry, as the etcd and ZooKeeper backends do.
type reachRegistry struct {
	hangingRegistry
	unreachable error
}

func (r reachRegistry) Unreachable() error { return r.unreachable }

var errNoRoute = errors.New("fake: 127.0.0.1:1 unreachable: connection refused")

// TestCacheSaysRegistryUnreachable: a first lookup that got no answer
// within InitialTimeout, no watch attempt having failed, says that the
// registry could not be reached when its client knows it, wrapping the
// client's error and ErrUnavailable; with a client that is connected, or
// cannot tell, it says the registry did not answer.
func TestCacheSaysRegistryUnreachable(t *testing.T) {
	st := static.New()
	defer st.Close()
	const initial = 100 * time.Millisecond
	tests := []struct {
		name     string
		r        registry.Registry
		want     string
		notWant  string
		wrapping error
	}{
		{"unreachable", reachRegistry{hangingRegistry{st}, fmt.Errorf("%w: %w", registry.ErrUnavailable, errNoRoute)},
			"the registry could not be reached in 100ms: registry: unavailable: " + errNoRoute.Error(), "no answer", errNoRoute},
		{"connected", reachRegistry{hangingRegistry{st}, nil}, "no answer within 100ms", "could not be reached", nil},
		{"cannot tell", hangingRegistry{st}, "no answer within 100ms", "could not be reached", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, tt.r, registry.CacheConfig{InitialTimeout: initial})
			_, err := c.Instances(context.Background(), "a.A")
			if err == nil || !errors.Is(err, registry.ErrUnavailable) {
				t.Fatalf("Instances = %v; want an error wrapping registry.ErrUnavailable", err)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), tt.notWant) {
				t.Fatalf("Instances = %q; want it to say %q, not %q", err, tt.want, tt.notWant)
			}
			if tt.wrapping != nil && !errors.Is(err, tt.wrapping) {
				t.Fatalf("Instances = %v; want it to wrap the client's error %q", err, tt.wrapping)
			}
			// Later lookups fail at once with the same error.
			ctx, cancel := context.WithTimeout(context.Background(), initial/2)
			defer cancel()
			if _, again := c.Instances(ctx, "a.A"); again == nil || again.Error() != err.Error() {
				t.Fatalf("second lookup = %v; want the first one's error at once: %v", again, err)
			}
		})
	}
}

// cutRegistry fails every Watch as a connection closing under it does,
// and its client knows it cannot reach the registry.
type cutRegistry struct{ registry.Registry }

func (cutRegistry) Watch(context.Context, string) (registry.Watcher, error) {
	return nil, fmt.Errorf("%w: zk: connection closed", registry.ErrUnavailable)
}

func (cutRegistry) Unreachable() error {
	return fmt.Errorf("%w: %w", registry.ErrUnavailable, errNoRoute)
}

// TestCacheUnreachableOutranksAWatchError: when the watch attempts failed
// because the connection went ("connection closed") and the client knows
// the registry cannot be reached, the first lookup says the latter, which
// names the servers and why.
func TestCacheUnreachableOutranksAWatchError(t *testing.T) {
	st := static.New()
	defer st.Close()
	c := newCache(t, cutRegistry{st}, registry.CacheConfig{InitialTimeout: 100 * time.Millisecond})
	_, err := c.Instances(context.Background(), "a.A")
	if !errors.Is(err, errNoRoute) || !strings.Contains(err.Error(), "could not be reached") {
		t.Fatalf("Instances = %v; want it to say the registry could not be reached, wrapping %q", err, errNoRoute)
	}
}

// downThenRefusingRegistry fails Watch as unreachable until refuse is
// set, then refuses the service (ErrInvalid).
type downThenRefusingRegistry struct {
	registry.Registry
	refuse  atomic.Bool
	refused atomic.Int32 // Watch calls answered with the refusal
}

func (r *downThenRefusingRegistry) Watch(context.Context, string) (registry.Watcher, error) {
	if r.refuse.Load() {
		r.refused.Add(1)
		return nil, fmt.Errorf("review: refused: %w", registry.ErrInvalid)
	}
	return nil, fmt.Errorf("review: down: %w", registry.ErrUnavailable)
}

// TestRefusalAfterGivingUp: a service whose first lookup gave up (registry
// unreachable, no snapshot) and that the registry then refuses fails its
// lookups with the refusal (ErrInvalid, for good), not with the outage.
func TestRefusalAfterGivingUp(t *testing.T) {
	st := static.New()
	defer st.Close()
	r := &downThenRefusingRegistry{Registry: st}
	c := newCache(t, r, registry.CacheConfig{InitialTimeout: 50 * time.Millisecond,
		MinRetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond})
	if _, err := c.Instances(context.Background(), "a.A"); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("first lookup with the registry down = %v, want ErrUnavailable", err)
	}
	r.refuse.Store(true)
	eventually(t, "the registry to refuse the service", func() bool { return r.refused.Load() > 0 })
	// The watch goroutine records the refusal (fail) right after Watch
	// returns: give it a moment.
	var err error
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err = c.Instances(context.Background(), "a.A"); errors.Is(err, registry.ErrInvalid) {
			break
		}
	}
	if !errors.Is(err, registry.ErrInvalid) || errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("lookup after the registry refused the service = %v; want the refusal (ErrInvalid), not the stale ErrUnavailable", err)
	}
}

func TestCacheFollowsChanges(t *testing.T) {
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c := newCache(t, st, registry.CacheConfig{})
	pushes := subscribe(t, c, "a.A")
	expectPush(t, pushes, "1")
	if got := idsOf(lookup(t, c, "a.A")); got != "1" {
		t.Fatalf("Instances = [%s], want [1]", got)
	}

	mustRegister(t, st, inst("a.A", "2"))
	expectPush(t, pushes, "1,2")
	if got := idsOf(lookup(t, c, "a.A")); got != "1,2" {
		t.Fatalf("Instances after a push = [%s], want [1,2]", got)
	}
	mustDeregister(t, st, inst("a.A", "1"))
	expectPush(t, pushes, "2")
	if c.Stale("a.A") || c.Suspect("a.A") {
		t.Fatal("Stale or Suspect set while the registry is up and the list is not empty")
	}
}

func TestCacheKeepsListWhileRegistryDown(t *testing.T) {
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	f := newFault(st)
	logs := &logCounter{}
	c := newCache(t, f, registry.CacheConfig{Logger: slog.New(logs)})
	pushes := subscribe(t, c, "a.A")
	expectPush(t, pushes, "1")
	<-f.watched // the first Watch

	f.setDown(true)
	for range 3 { // the cache retries with backoff
		select {
		case <-f.watched:
		case <-time.After(waitTimeout):
			t.Fatal("the cache did not retry its watch while the registry was down")
		}
	}
	if !c.Stale("a.A") {
		t.Fatal("Stale = false while the registry is down")
	}
	if got := idsOf(lookup(t, c, "a.A")); got != "1" {
		t.Fatalf("Instances while down = [%s], want the last known [1]", got)
	}
	if n := logs.count("unreachable"); n != 1 {
		t.Fatalf("logged the outage %d times, want once", n)
	}

	mustRegister(t, st, inst("a.A", "2")) // a change during the outage
	f.setDown(false)
	expectPush(t, pushes, "1,2")
	if c.Stale("a.A") {
		t.Fatal("Stale = true after the registry answered again")
	}
	if n := logs.count("reachable again"); n != 1 {
		t.Fatalf("logged the recovery %d times, want once", n)
	}
}

func TestCacheEmptyPush(t *testing.T) {
	tests := []struct {
		name        string
		protection  registry.EmptyProtection
		wantIDs     string
		wantSuspect bool
	}{
		{"ProtectEmpty", registry.ProtectEmpty, "1", true},
		{"AllowEmpty", registry.AllowEmpty, "", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st := static.New(inst("a.A", "1"))
			defer st.Close()
			c := newCache(t, st, registry.CacheConfig{EmptyProtection: tt.protection})
			pushes := subscribe(t, c, "a.A")
			expectPush(t, pushes, "1")

			mustDeregister(t, st, inst("a.A", "1"))
			if tt.wantSuspect {
				eventually(t, "Suspect after an empty push", func() bool { return c.Suspect("a.A") })
			} else {
				expectPush(t, pushes, "")
			}
			if got := idsOf(lookup(t, c, "a.A")); got != tt.wantIDs {
				t.Fatalf("Instances after an empty push = [%s], want [%s]", got, tt.wantIDs)
			}
			if c.Suspect("a.A") != tt.wantSuspect {
				t.Fatalf("Suspect = %v, want %v", c.Suspect("a.A"), tt.wantSuspect)
			}
			if c.Stale("a.A") {
				t.Fatal("Stale = true although the registry is up")
			}

			mustRegister(t, st, inst("a.A", "3"))
			expectPush(t, pushes, "3")
			if c.Suspect("a.A") {
				t.Fatal("Suspect = true after a non-empty push")
			}
		})
	}
}

// TestCacheRefusedService: a service the registry refuses (ErrInvalid)
// is not an outage: Instances returns the refusal at once, wrapped, and
// the cache does not watch the service again.
func TestCacheRefusedService(t *testing.T) {
	before := goleak.IgnoreCurrent()
	st := static.New()
	defer st.Close()
	r := &refusingRegistry{Registry: st}
	const initialTimeout = time.Second
	c := newCache(t, r, registry.CacheConfig{InitialTimeout: initialTimeout})
	for i := range 2 {
		start := time.Now()
		_, err := c.Instances(context.Background(), "a.A")
		took := time.Since(start)
		if !errors.Is(err, errRefused) || errors.Is(err, registry.ErrUnavailable) {
			t.Fatalf("lookup %d: Instances = %v; want an error wrapping the registry's (registry.ErrInvalid), not registry.ErrUnavailable", i+1, err)
		}
		if took >= initialTimeout/2 {
			t.Fatalf("lookup %d: Instances took %v; want the refusal at once, not after InitialTimeout (%v)", i+1, took, initialTimeout)
		}
	}
	// The watch goroutine has ended: nothing retries the Watch.
	goleak.VerifyNone(t, before)
	if n := r.watchCalls.Load(); n != 1 {
		t.Fatalf("Watch called %d times, want once", n)
	}
	if c.Stale("a.A") {
		t.Fatal("Stale = true for a service with no instances")
	}
}

// scriptRegistry's one watcher returns the sets sent on its channel.
type scriptRegistry struct {
	registry.Registry
	sets chan []registry.Instance
}

func (r scriptRegistry) Watch(context.Context, string) (registry.Watcher, error) {
	return scriptWatcher{r.sets}, nil
}

type scriptWatcher struct{ sets chan []registry.Instance }

func (w scriptWatcher) Next(ctx context.Context) ([]registry.Instance, error) {
	select {
	case set := <-w.sets:
		return set, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (scriptWatcher) Stop() {}

// TestCacheStoresPushedSets: the cache keeps a pushed set that is sorted
// by ID as it is, sorts one that is not, and tells subscribers of a set
// only when it differs from the last, also when its Metadata maps are
// other maps with the same contents.
func TestCacheStoresPushedSets(t *testing.T) {
	r := scriptRegistry{sets: make(chan []registry.Instance)}
	c := newCache(t, r, registry.CacheConfig{})
	a := inst("a.A", "a")
	b := func(v string) registry.Instance {
		in := inst("a.A", "b")
		in.Metadata = map[string]string{"v": v}
		return in
	}
	b1 := b("1")
	pushes := make(chan string, 100)
	unsub, err := c.Subscribe("a.A", func(ins []registry.Instance) {
		pushes <- idsOf(ins) + "/" + ins[len(ins)-1].Metadata["v"]
	})
	if err != nil {
		t.Fatal(err)
	}
	defer unsub()
	send := func(set ...registry.Instance) []registry.Instance {
		t.Helper()
		select {
		case r.sets <- set:
		case <-time.After(waitTimeout):
			t.Fatalf("the cache did not ask for %v within %v", set, waitTimeout)
		}
		return set
	}
	send(b1, a)
	expectPush(t, pushes, "a,b/1")
	send(a, b1)     // the same instances, sorted
	send(a, b("1")) // the same, in another map
	sorted := send(a, b("2"))
	expectPush(t, pushes, "a,b/2")
	if got := lookup(t, c, "a.A"); &got[0] != &sorted[0] {
		t.Error("the cache copied a set sorted by ID")
	}
	send(a, a, b("2"))
	expectPush(t, pushes, "a,a,b/2")
	send(a, b("2"))
	expectPush(t, pushes, "a,b/2")
}
