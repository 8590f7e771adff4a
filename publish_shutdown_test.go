package dabb_test

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/registry"
)

// completingRegistry is a registry whose held Register, once started,
// completes: it waits for release (the write already on its way to the
// backend, as an etcd Put or a ZooKeeper create that was sent) and then
// succeeds, even if its context was cancelled meanwhile. The server's 5 s
// registry timeout is never reached in these tests.
type completingRegistry struct {
	held       string      // the service whose Register waits for release; "" for all
	entered    chan string // the service of each Register that waits
	release    chan struct{}
	registered chan string // the service of each Register that succeeded
	mu         sync.Mutex
	live       map[string]registry.Instance
}

func newCompletingRegistry(held string) *completingRegistry {
	return &completingRegistry{held: held, entered: make(chan string, 8), release: make(chan struct{}),
		registered: make(chan string, 8), live: map[string]registry.Instance{}}
}

func (r *completingRegistry) Register(_ context.Context, in registry.Instance) error {
	if r.held == "" || r.held == in.Service {
		r.entered <- in.Service
		<-r.release
	}
	r.mu.Lock()
	r.live[in.Service] = in
	r.mu.Unlock()
	r.registered <- in.Service
	return nil
}

func (r *completingRegistry) Deregister(_ context.Context, in registry.Instance) error {
	r.mu.Lock()
	delete(r.live, in.Service)
	r.mu.Unlock()
	return nil
}

func (r *completingRegistry) Watch(context.Context, string) (registry.Watcher, error) {
	return nil, errors.New("completing: no watch")
}

func (r *completingRegistry) Close() error { return nil }

// listed returns the services the registry lists, sorted.
func (r *completingRegistry) listed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Sorted(maps.Keys(r.live))
}

func awaitService(t *testing.T, ch <-chan string, want, what string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("%s: got %s, want %s", what, got, want)
		}
	case <-time.After(testTimeout):
		t.Fatalf("%s: none for %s", what, want)
	}
}

// TestServeShutDownWhilePublishingLeavesNothing: Shutdown begins while
// Serve is publishing and gives up waiting for it when its ctx ends; the
// Register under way then succeeds. Serve withdraws that instance itself
// before it returns ErrServerClosed: the withdrawal is over, and nothing
// else would.
func TestServeShutDownWhilePublishingLeavesNothing(t *testing.T) {
	reg := newCompletingRegistry("")
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	_, done := serveGated(t, s)
	awaitService(t, reg.entered, probeDesc.Name, "Serve's Register")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want it to give up waiting for the publishing Serve", err)
	}
	close(reg.release) // the Register that was under way succeeds
	awaitService(t, reg.registered, probeDesc.Name, "the late Register")
	select {
	case err := <-done:
		if err != dabb.ErrServerClosed {
			t.Errorf("Serve = %v, want ErrServerClosed", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return")
	}
	if got := reg.listed(); len(got) != 0 {
		t.Errorf("after Shutdown and Serve's return the registry lists %v: clients keep choosing a closed server", got)
	}
}

// TestRegisterServiceShutDownWhilePublishingLeavesNothing: Shutdown
// begins while RegisterService publishes a service on a serving server
// and gives up waiting for it. It still withdraws what was published
// before; the Register under way then succeeds, and RegisterService
// withdraws that instance itself and reports ErrServerClosed.
func TestRegisterServiceShutDownWhilePublishingLeavesNothing(t *testing.T) {
	second := probeDesc
	second.Name = "test.Probe2"
	reg := newCompletingRegistry(second.Name)
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	_, done := serveGated(t, s)
	awaitService(t, reg.registered, probeDesc.Name, "Serve's Register")
	regErr := make(chan error, 1)
	go func() { regErr <- s.RegisterService(&second, newProbe()) }()
	awaitService(t, reg.entered, second.Name, "RegisterService's Register")

	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := s.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Shutdown = %v, want it to give up waiting for RegisterService", err)
	}
	if got := reg.listed(); len(got) != 0 {
		t.Errorf("Shutdown left %v in the registry while a RegisterService was publishing", got)
	}
	close(reg.release) // the Register that was under way succeeds
	awaitService(t, reg.registered, second.Name, "the late Register")
	select {
	case err := <-regErr:
		if !errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("RegisterService = %v, want an error wrapping ErrServerClosed", err)
		}
	case <-time.After(testTimeout):
		t.Fatal("RegisterService did not return")
	}
	if got := reg.listed(); len(got) != 0 {
		t.Errorf("after Shutdown and RegisterService's return the registry lists %v", got)
	}
	select {
	case <-done:
	case <-time.After(testTimeout):
		t.Fatal("Serve did not return")
	}

	// Once shutdown began, a service is not published at all.
	third := probeDesc
	third.Name = "test.Probe3"
	if err := s.RegisterService(&third, newProbe()); err != nil {
		t.Errorf("RegisterService after Shutdown: %v", err)
	}
	if got := reg.listed(); len(got) != 0 {
		t.Errorf("RegisterService after Shutdown published: the registry lists %v", got)
	}
}
