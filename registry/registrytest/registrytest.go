// Package registrytest checks that a registry backend behaves as
// [registry.Registry] and [registry.Watcher] promise.
//
// A backend's test calls [Run] with a function that returns a new, independent
// client of the same registry (for server backends: a new client of one shared
// test server):
//
//	func TestConformance(t *testing.T) {
//		srv := etcdtest.Shared(t)
//		registrytest.Run(t, func(t *testing.T) registry.Registry {
//			r, err := etcd.New(etcd.Config{Endpoints: []string{srv.Endpoint()}})
//			if err != nil {
//				t.Fatal(err)
//			}
//			return r
//		})
//	}
//
// Every subtest uses service names of its own, so subtests and packages may
// share one server.
package registrytest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

// Bounds of the waits in the suite. A backend must make a change visible to
// a watcher of another client within VisibleTimeout.
const (
	// VisibleTimeout bounds how long a registration or a deregistration
	// may take to reach a watcher.
	VisibleTimeout = time.Second
	// CallTimeout bounds each Register, Deregister and Watch call.
	CallTimeout = 5 * time.Second
	// quietPeriod is how long a watcher must stay silent when nothing
	// changed.
	quietPeriod = 200 * time.Millisecond
)

// Run runs the conformance suite as subtests of t.
//
// newRegistry is called one or more times per subtest; each call must return
// a new client of the same registry, so that what one client registers the
// others see. Run closes every registry it obtains (Close may therefore be
// called twice if newRegistry also arranges a Close: the second call must
// return nil or [registry.ErrClosed]).
//
// The suite checks: registrations and deregistrations reach a watcher of
// another client within [VisibleTimeout]; instances round-trip with weight
// and metadata; a watcher returns the current set at once and then every
// change as a full set, and nothing when nothing changed; Next ends with
// ctx.Err() when its context ends and with [registry.ErrWatcherStopped] after
// Stop; the context of Watch bounds only the call, not the watch; registering
// twice updates the instance; Close deregisters what the client registered
// and later calls fail with [registry.ErrClosed]; services, even one whose
// name is a prefix of another's, do not see each other's instances; invalid
// instances and service names are rejected with an error.
func Run(t *testing.T, newRegistry func(t *testing.T) registry.Registry) {
	t.Helper()
	s := &suite{newRegistry: newRegistry}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"FirstNextReturnsCurrentSet", s.testFirstNext},
		{"RegisterVisible", s.testRegisterVisible},
		{"DeregisterGone", s.testDeregisterGone},
		{"TwoInstances", s.testTwoInstances},
		{"WeightAndMetadataRoundTrip", s.testRoundTrip},
		{"WatchSeesEachChange", s.testEachChange},
		{"ContextEndsNext", s.testContextEndsNext},
		{"WatchContextBoundsOnlySetup", s.testWatchContext},
		{"StopEndsNext", s.testStop},
		{"RegisterTwiceUpdates", s.testRegisterTwice},
		{"CloseDeregisters", s.testCloseDeregisters},
		{"ServicesIsolated", s.testIsolation},
		{"InvalidInput", s.testInvalidInput},
	}
	for _, tt := range tests {
		t.Run(tt.name, tt.fn)
	}
}

type suite struct {
	newRegistry func(t *testing.T) registry.Registry
}

// open returns a new client that is closed when the test ends.
func (s *suite) open(t *testing.T) registry.Registry {
	t.Helper()
	r := s.newRegistry(t)
	if r == nil {
		t.Fatal("registrytest: newRegistry returned nil")
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil && !errors.Is(err, registry.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

var serial atomic.Int64

// serviceName returns a service name no other test uses, built from the
// test's name so a stray key in a shared server points to its test.
func serviceName(t *testing.T) string {
	name := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '-':
			return r
		}
		return '.'
	}, t.Name())
	return fmt.Sprintf("rt.%s.%d.%d", name, time.Now().UnixNano(), serial.Add(1))
}

func instance(service, id string, port int) registry.Instance {
	return registry.Instance{Service: service, ID: id, Addr: fmt.Sprintf("127.0.0.1:%d", port)}
}

func register(t *testing.T, r registry.Registry, in registry.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	if err := r.Register(ctx, in); err != nil {
		t.Fatalf("Register(%s/%s): %v", in.Service, in.ID, err)
	}
}

func deregister(t *testing.T, r registry.Registry, in registry.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	if err := r.Deregister(ctx, in); err != nil {
		t.Fatalf("Deregister(%s/%s): %v", in.Service, in.ID, err)
	}
}

// watch starts a watcher that is stopped when the test ends.
func watch(t *testing.T, r registry.Registry, service string) registry.Watcher {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	w, err := r.Watch(ctx, service)
	if err != nil {
		t.Fatalf("Watch(%s): %v", service, err)
	}
	if w == nil {
		t.Fatalf("Watch(%s) returned a nil Watcher and no error", service)
	}
	t.Cleanup(w.Stop)
	return w
}

// next calls Next once, bounded by timeout.
func next(t *testing.T, w registry.Watcher, timeout time.Duration) []registry.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	start := time.Now()
	got, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Next: no set within %v: %v (after %v)", timeout, err, time.Since(start).Round(time.Millisecond))
	}
	return got
}

// nextExactly calls Next once and requires the given set.
func nextExactly(t *testing.T, w registry.Watcher, step string, want ...registry.Instance) {
	t.Helper()
	got := next(t, w, VisibleTimeout)
	if !sameSet(got, want) {
		t.Fatalf("%s: Next returned %s, want %s", step, format(got), format(want))
	}
}

// waitFor calls Next until it returns the given set, within timeout.
func waitFor(t *testing.T, w registry.Watcher, timeout time.Duration, step string, want ...registry.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var last []registry.Instance
	seen := false
	for {
		got, err := w.Next(ctx)
		if err != nil {
			lastText := "nothing"
			if seen {
				lastText = format(last)
			}
			t.Fatalf("%s: watcher did not reach %s within %v (last set: %s): %v", step, format(want), timeout, lastText, err)
		}
		if sameSet(got, want) {
			return
		}
		last, seen = got, true
	}
}

// quiet requires Next to return nothing for quietPeriod.
func quiet(t *testing.T, w registry.Watcher, step string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), quietPeriod)
	defer cancel()
	got, err := w.Next(ctx)
	if err == nil {
		t.Fatalf("%s: Next returned %s although nothing changed", step, format(got))
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%s: Next returned error %v, want context.DeadlineExceeded", step, err)
	}
}

func sameSet(got, want []registry.Instance) bool {
	if len(got) != len(want) {
		return false
	}
	g, w := sorted(got), sorted(want)
	for i := range g {
		if !sameInstance(g[i], w[i]) {
			return false
		}
	}
	return true
}

func sameInstance(a, b registry.Instance) bool {
	return a.Service == b.Service && a.ID == b.ID && a.Addr == b.Addr &&
		a.EffectiveWeight() == b.EffectiveWeight() && maps.Equal(a.Metadata, b.Metadata)
}

func sorted(in []registry.Instance) []registry.Instance {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b registry.Instance) int { return strings.Compare(a.ID, b.ID) })
	return out
}

func format(in []registry.Instance) string {
	if len(in) == 0 {
		return "{}"
	}
	parts := make([]string, 0, len(in))
	for _, x := range sorted(in) {
		p := fmt.Sprintf("%s/%s@%s", x.Service, x.ID, x.Addr)
		if x.Weight != 0 {
			p += fmt.Sprintf(" w=%d", x.Weight)
		}
		if len(x.Metadata) > 0 {
			p += fmt.Sprintf(" md=%v", x.Metadata)
		}
		parts = append(parts, p)
	}
	return "{" + strings.Join(parts, ", ") + "}"
}

func (s *suite) testFirstNext(t *testing.T) {
	r := s.open(t)
	svc := serviceName(t)
	w := watch(t, r, svc)
	nextExactly(t, w, "first Next on an empty service")

	a := instance(svc, "a", 20001)
	register(t, r, a)
	w2 := watch(t, s.open(t), svc)
	nextExactly(t, w2, "first Next on a service with one instance", a)
}

func (s *suite) testRegisterVisible(t *testing.T) {
	provider, consumer := s.open(t), s.open(t)
	svc := serviceName(t)
	w := watch(t, consumer, svc)
	nextExactly(t, w, "before Register")

	a := instance(svc, "a", 20001)
	register(t, provider, a)
	waitFor(t, w, VisibleTimeout, "after Register", a)
}

func (s *suite) testDeregisterGone(t *testing.T) {
	provider, consumer := s.open(t), s.open(t)
	svc := serviceName(t)
	a := instance(svc, "a", 20001)
	register(t, provider, a)
	w := watch(t, consumer, svc)
	waitFor(t, w, VisibleTimeout, "after Register", a)

	deregister(t, provider, a)
	waitFor(t, w, VisibleTimeout, "after Deregister")
}

func (s *suite) testTwoInstances(t *testing.T) {
	p1, p2, consumer := s.open(t), s.open(t), s.open(t)
	svc := serviceName(t)
	a, b := instance(svc, "a", 20001), instance(svc, "b", 20002)
	register(t, p1, a)
	register(t, p2, b)
	w := watch(t, consumer, svc)
	waitFor(t, w, VisibleTimeout, "two providers", a, b)

	deregister(t, p1, a)
	waitFor(t, w, VisibleTimeout, "after the first deregisters", b)
}

func (s *suite) testRoundTrip(t *testing.T) {
	provider, consumer := s.open(t), s.open(t)
	svc := serviceName(t)
	a := registry.Instance{
		Service:  svc,
		ID:       "10.0.0.7:20880",
		Addr:     "10.0.0.7:20880",
		Weight:   37,
		Metadata: map[string]string{"version": "1.2.0", "zone": "eu-1", "empty": "", "unicode": "zoné ✓"},
	}
	register(t, provider, a)
	w := watch(t, consumer, svc)
	got := next(t, w, VisibleTimeout)
	if len(got) == 0 {
		got = next(t, w, VisibleTimeout)
	}
	if len(got) != 1 {
		t.Fatalf("watcher returned %s, want exactly %s", format(got), format([]registry.Instance{a}))
	}
	g := got[0]
	if g.Service != a.Service || g.ID != a.ID || g.Addr != a.Addr || g.Weight != a.Weight {
		t.Errorf("instance = %+v, want %+v", g, a)
	}
	if !maps.Equal(g.Metadata, a.Metadata) {
		t.Errorf("metadata = %q, want %q", g.Metadata, a.Metadata)
	}
}

func (s *suite) testEachChange(t *testing.T) {
	provider, consumer := s.open(t), s.open(t)
	svc := serviceName(t)
	w := watch(t, consumer, svc)
	nextExactly(t, w, "start")
	quiet(t, w, "after the first Next")

	a, b := instance(svc, "a", 20001), instance(svc, "b", 20002)
	register(t, provider, a)
	nextExactly(t, w, "add a", a)
	register(t, provider, b)
	nextExactly(t, w, "add b", a, b)
	deregister(t, provider, a)
	nextExactly(t, w, "remove a", b)
	quiet(t, w, "after the last change")
}

func (s *suite) testContextEndsNext(t *testing.T) {
	r := s.open(t)
	svc := serviceName(t)
	w := watch(t, r, svc)
	nextExactly(t, w, "first Next")

	t.Run("Deadline", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		if _, err := w.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next after its deadline: err = %v, want context.DeadlineExceeded", err)
		}
	})
	t.Run("Cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := w.Next(ctx)
			done <- err
		}()
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Next after cancel: err = %v, want context.Canceled", err)
			}
		case <-time.After(VisibleTimeout):
			t.Fatalf("Next still blocked %v after its context was canceled", VisibleTimeout)
		}
	})
	t.Run("StillWorks", func(t *testing.T) {
		a := instance(svc, "a", 20001)
		register(t, r, a)
		waitFor(t, w, VisibleTimeout, "a change after canceled Next calls", a)
	})
}

func (s *suite) testWatchContext(t *testing.T) {
	provider, consumer := s.open(t), s.open(t)
	svc := serviceName(t)
	ctx, cancel := context.WithCancel(context.Background())
	w, err := consumer.Watch(ctx, svc)
	if err != nil {
		cancel()
		t.Fatalf("Watch: %v", err)
	}
	t.Cleanup(w.Stop)
	cancel() // ends the Watch call's context, not the watch
	nextExactly(t, w, "after the Watch context ended")
	a := instance(svc, "a", 20001)
	register(t, provider, a)
	waitFor(t, w, VisibleTimeout, "Register after the Watch context ended", a)
}

func (s *suite) testStop(t *testing.T) {
	r := s.open(t)
	svc := serviceName(t)
	w := watch(t, r, svc)
	nextExactly(t, w, "first Next")

	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := w.Next(ctx)
		done <- err
	}()
	w.Stop()
	select {
	case err := <-done:
		if !errors.Is(err, registry.ErrWatcherStopped) {
			t.Fatalf("blocked Next after Stop: err = %v, want ErrWatcherStopped", err)
		}
	case <-time.After(VisibleTimeout):
		t.Fatalf("Next still blocked %v after Stop", VisibleTimeout)
	}
	if _, err := w.Next(ctx); !errors.Is(err, registry.ErrWatcherStopped) {
		t.Fatalf("Next after Stop: err = %v, want ErrWatcherStopped", err)
	}
	w.Stop() // a second Stop must be harmless
}

func (s *suite) testRegisterTwice(t *testing.T) {
	provider, consumer := s.open(t), s.open(t)
	svc := serviceName(t)
	a := instance(svc, "a", 20001)
	a.Weight = 10
	register(t, provider, a)
	w := watch(t, consumer, svc)
	waitFor(t, w, VisibleTimeout, "first Register", a)

	register(t, provider, a)
	quiet(t, w, "the same instance registered again")

	b := a
	b.Weight = 20
	b.Metadata = map[string]string{"version": "2"}
	register(t, provider, b)
	waitFor(t, w, VisibleTimeout, "Register with a new weight and metadata", b)

	deregister(t, provider, b)
	waitFor(t, w, VisibleTimeout, "Deregister after two Registers")
}

func (s *suite) testCloseDeregisters(t *testing.T) {
	provider := s.newRegistry(t)
	if provider == nil {
		t.Fatal("registrytest: newRegistry returned nil")
	}
	consumer := s.open(t)
	svc := serviceName(t)
	a, b := instance(svc, "a", 20001), instance(svc, "b", 20002)
	register(t, provider, a)
	register(t, provider, b)
	w := watch(t, consumer, svc)
	waitFor(t, w, VisibleTimeout, "registered", a, b)

	pw := watch(t, provider, svc)
	if err := provider.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	waitFor(t, w, VisibleTimeout, "after the provider's Close")

	ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
	defer cancel()
	if err := provider.Register(ctx, a); !errors.Is(err, registry.ErrClosed) {
		t.Errorf("Register after Close: err = %v, want ErrClosed", err)
	}
	if _, err := provider.Watch(ctx, svc); !errors.Is(err, registry.ErrClosed) {
		t.Errorf("Watch after Close: err = %v, want ErrClosed", err)
	}
	if err := provider.Close(); err != nil && !errors.Is(err, registry.ErrClosed) {
		t.Errorf("second Close: err = %v, want nil or ErrClosed", err)
	}
	// A watcher of a closed registry must not block forever.
	for {
		nctx, ncancel := context.WithTimeout(context.Background(), VisibleTimeout)
		_, err := pw.Next(nctx)
		ncancel()
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next on a watcher of a closed registry still blocks after %v; want an error", VisibleTimeout)
		}
		if err != nil {
			break
		}
	}
}

func (s *suite) testIsolation(t *testing.T) {
	p, consumer := s.open(t), s.open(t)
	svcA := serviceName(t)
	svcB := svcA + "x" // a prefix of the other's name must not match
	a, b := instance(svcA, "a", 20001), instance(svcB, "b", 20002)
	wa, wb := watch(t, consumer, svcA), watch(t, consumer, svcB)
	nextExactly(t, wa, "first Next of "+svcA)
	nextExactly(t, wb, "first Next of "+svcB)
	register(t, p, b)
	nextExactly(t, wb, "register in "+svcB, b)
	quiet(t, wa, "a change in another service")
	register(t, p, a)
	nextExactly(t, wa, "register in "+svcA, a)
	quiet(t, wb, "a change in another service")
}

func (s *suite) testInvalidInput(t *testing.T) {
	r := s.open(t)
	svc := serviceName(t)
	bad := []struct {
		name string
		in   registry.Instance
	}{
		{"NoService", registry.Instance{ID: "a", Addr: "127.0.0.1:1"}},
		{"NoID", registry.Instance{Service: svc, Addr: "127.0.0.1:1"}},
		{"NoAddr", registry.Instance{Service: svc, ID: "a"}},
		{"SlashInService", registry.Instance{Service: svc + "/x", ID: "a", Addr: "127.0.0.1:1"}},
		{"SlashInID", registry.Instance{Service: svc, ID: "a/b", Addr: "127.0.0.1:1"}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
			defer cancel()
			if err := r.Register(ctx, tt.in); err == nil {
				t.Errorf("Register(%+v) = nil, want an error", tt.in)
			}
		})
	}
	for _, name := range []string{"", "a/b", "/"} {
		t.Run(fmt.Sprintf("Watch%q", name), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), CallTimeout)
			defer cancel()
			w, err := r.Watch(ctx, name)
			if err == nil {
				w.Stop()
				t.Errorf("Watch(%q) = nil error, want an error", name)
			}
		})
	}
}
