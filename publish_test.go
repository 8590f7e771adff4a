package dabb_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/registry"
	_ "github.com/dabbrpc/dabb/registry/etcd"
	_ "github.com/dabbrpc/dabb/registry/zk"
)

// gatedRegistry is a registry (a fake, for the server's ordering above the
// registry; the real ones have their own tests) whose calls report
// themselves and can be held until released, or refused per service.
type gatedRegistry struct {
	mu     sync.Mutex
	live   map[string]registry.Instance
	refuse string // Register of this service fails (set before use, or under mu)
	// lateComplete: a held Register whose context ends still registers
	// (as ZooKeeper's create may), though it returns the context's error.
	lateComplete bool
	down         atomic.Int32  // this many Registers fail as unreachable
	held         string        // "register", "deregister" or "": the calls that wait for hold
	hold         chan struct{} // closed to let held calls go (or their ctx ends)
	entered      chan string   // "register S" / "deregister S", as calls begin
	// registered gets the service of each Register that succeeded.
	registered chan string
}

func newGatedRegistry(held string) *gatedRegistry {
	return &gatedRegistry{live: map[string]registry.Instance{}, held: held, hold: make(chan struct{}),
		entered: make(chan string, 64), registered: make(chan string, 64)}
}

func (r *gatedRegistry) wait(ctx context.Context, op string) error {
	if op != r.held {
		return nil
	}
	select {
	case <-r.hold:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (r *gatedRegistry) Register(ctx context.Context, in registry.Instance) error {
	// The outcome is decided before the call reports itself, so a test
	// that changes refuse on seeing it changes only later calls.
	r.mu.Lock()
	refused := in.Service == r.refuse
	r.mu.Unlock()
	down := !refused && r.down.Add(-1) >= 0
	r.entered <- "register " + in.Service
	if refused {
		return errors.New("gated: register refused")
	}
	if down {
		return fmt.Errorf("gated: %w", registry.ErrUnavailable)
	}
	if err := r.wait(ctx, "register"); err != nil {
		if r.lateComplete {
			r.mu.Lock()
			r.live[in.Service] = in
			r.mu.Unlock()
		}
		return err
	}
	r.mu.Lock()
	r.live[in.Service] = in
	r.mu.Unlock()
	select {
	case r.registered <- in.Service:
	default: // no test registers 64 times without reading
	}
	return nil
}

func (r *gatedRegistry) Deregister(ctx context.Context, in registry.Instance) error {
	r.entered <- "deregister " + in.Service
	if err := r.wait(ctx, "deregister"); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.live, in.Service)
	return nil
}

func (r *gatedRegistry) Watch(context.Context, string) (registry.Watcher, error) {
	return nil, errors.New("gated: no watch")
}

func (r *gatedRegistry) Close() error { return nil }

func (r *gatedRegistry) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.live)
}

func awaitEntered(t *testing.T, r *gatedRegistry, want string) {
	t.Helper()
	select {
	case got := <-r.entered:
		if got != want {
			t.Fatalf("registry call %q, want %q", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("no registry call %q", want)
	}
}

// serveGated serves s on a fresh listener; the returned channel has
// Serve's result.
func serveGated(t *testing.T, s *dabb.Server) (string, <-chan error) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	return l.Addr().String(), done
}

// TestOverlappingShutdownsWithdrawFirst: a second Shutdown while the
// first is withdrawing the instance waits for the withdrawal; the server
// never stops accepting while it is still published.
func TestOverlappingShutdownsWithdrawFirst(t *testing.T) {
	reg := newGatedRegistry("deregister")
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	addr, done := serveGated(t, s)
	awaitEntered(t, reg, "register "+probeDesc.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- s.Shutdown(ctx) }()
	awaitEntered(t, reg, "deregister "+probeDesc.Name)

	second := make(chan error, 1)
	go func() { second <- s.Shutdown(ctx) }()
	select {
	case err := <-second:
		t.Fatalf("the second Shutdown returned (%v) while the instance was still published", err)
	case <-time.After(100 * time.Millisecond): // a bound on what must not happen
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the server stopped accepting while still published: %v", err)
	}
	c.Close()
	close(reg.hold)
	for _, ch := range []chan error{first, second} {
		if err := <-ch; err != nil {
			t.Errorf("Shutdown: %v", err)
		}
	}
	if n := reg.count(); n != 0 {
		t.Errorf("%d instances still published", n)
	}
	if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
		t.Errorf("Serve = %v", err)
	}
}

// TestShutdownDuringPublish: a registry that does not answer while Serve
// publishes does not hold Shutdown past its context.
func TestShutdownDuringPublish(t *testing.T) {
	for _, late := range []bool{false, true} {
		t.Run(fmt.Sprintf("registry completes the interrupted register=%v", late), func(t *testing.T) {
			shutdownDuringPublish(t, late)
		})
	}
}

// shutdownDuringPublish: with late, the registry registers the instance
// whose Register the Shutdown interrupted; it must be withdrawn as well.
func shutdownDuringPublish(t *testing.T, late bool) {
	reg := newGatedRegistry("register")
	reg.lateComplete = late
	defer close(reg.hold)
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	_, done := serveGated(t, s)
	awaitEntered(t, reg, "register "+probeDesc.Name)
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = s.Shutdown(ctx) // gives up publishing: nothing was published
	if el := time.Since(start); el > 2*time.Second {
		t.Errorf("Shutdown took %v with a 300ms context", el)
	}
	if err := <-done; err != dabb.ErrServerClosed {
		t.Errorf("Serve = %v, want ErrServerClosed itself", err)
	}
	if n := reg.count(); n != 0 {
		t.Errorf("%d instances published after Shutdown", n)
	}
}

// TestFailedServeWithdrawsWhatItPublished: when one service cannot be
// published, Serve fails and leaves none of the others in the registry.
func TestFailedServeWithdrawsWhatItPublished(t *testing.T) {
	reg := newGatedRegistry("")
	second := probeDesc
	second.Name = "test.Probe2"
	reg.refuse = second.Name
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	for _, d := range []*dabb.ServiceDesc{&probeDesc, &second} {
		if err := s.RegisterService(d, newProbe()); err != nil {
			t.Fatal(err)
		}
	}
	defer s.Close()
	for range 4 { // the services are published in map order: both orders, likely
		_, done := serveGated(t, s)
		if err := <-done; err == nil || !strings.Contains(err.Error(), "register refused") {
			t.Fatalf("Serve = %v, want the publish error", err)
		}
		if n := reg.count(); n != 0 {
			t.Fatalf("Serve failed but left %d instance(s) published", n)
		}
	}
}

// TestFailedListenerWithdraws: a listener closed under a running Serve
// (not by Shutdown) takes its instances out of the registry, so clients
// stop choosing an address nobody answers at, and Serve, the withdrawal
// having succeeded, returns the accept error alone.
func TestFailedListenerWithdraws(t *testing.T) {
	reg := newGatedRegistry("")
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	defer s.Close()
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(l) }()
	awaitEntered(t, reg, "register "+probeDesc.Name)
	l.Close()
	select {
	case err := <-done:
		if !errors.Is(err, net.ErrClosed) || errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("Serve = %v, want the listener's error", err)
		}
		if joined(err) {
			t.Errorf("Serve returned %v wrapped in a join of one", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its listener closed")
	}
	if n := reg.count(); n != 0 {
		t.Errorf("the listener failed but %d instance(s) stay published", n)
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown after the failed listener: %v", err)
	}
}

// TestRegisterServiceWhileServing: a service registered after Serve is
// published at the served address at once and withdrawn by Shutdown; one
// whose publishing fails is refused and not kept.
func TestRegisterServiceWhileServing(t *testing.T) {
	reg := newGatedRegistry("")
	second, third := probeDesc, probeDesc
	second.Name, third.Name = "test.Probe2", "test.Probe3"
	reg.refuse = third.Name
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
	defer s.Close()
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	addr, done := serveGated(t, s)
	awaitEntered(t, reg, "register "+probeDesc.Name)

	if err := s.RegisterService(&second, newProbe()); err != nil {
		t.Fatalf("RegisterService while serving: %v", err)
	}
	awaitEntered(t, reg, "register "+second.Name)
	reg.mu.Lock()
	got := reg.live[second.Name]
	reg.mu.Unlock()
	if got.Addr != addr {
		t.Errorf("%s published at %q, want %q", second.Name, got.Addr, addr)
	}

	if err := s.RegisterService(&third, newProbe()); err == nil || !strings.Contains(err.Error(), "register refused") {
		t.Errorf("RegisterService with a failing registry = %v, want the publish error", err)
	}
	awaitEntered(t, reg, "register "+third.Name)
	if err := s.RegisterService(&third, newProbe()); err == nil || !strings.Contains(err.Error(), "register refused") {
		t.Errorf("second RegisterService of the refused service = %v: the first one was kept", err)
	}
	awaitEntered(t, reg, "register "+third.Name)
	shutdownWithdraws(t, s, reg, done)
}

// TestServeWhileRegistryDown: with WithRegistryCheck(false), a server
// started while its registry cannot be reached serves at once and
// publishes itself as soon as the registry answers; Shutdown withdraws it
// as usual.
func TestServeWhileRegistryDown(t *testing.T) {
	reg := newGatedRegistry("")
	reg.down.Store(3)
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithRegistryCheck(false), dabb.WithLogger(quiet))
	defer s.Close()
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	addr, done := serveGated(t, s)
	for range 4 { // three refused attempts, then the one that succeeds
		awaitEntered(t, reg, "register "+probeDesc.Name)
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the server does not accept while its registry is down: %v", err)
	}
	c.Close()
	select {
	case <-reg.registered:
	case <-time.After(10 * time.Second):
		t.Fatal("not published after the registry answered")
	}
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v while serving", err)
	default:
	}
	shutdownWithdraws(t, s, reg, done)
}

// TestServeBeforePublishingWithoutCheck: with WithRegistryCheck(false) a
// server answers calls while its first publishing attempt is still
// waiting for the registry (which may take the registry's whole timeout).
func TestServeBeforePublishingWithoutCheck(t *testing.T) {
	reg := newGatedRegistry("register")
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithRegistryCheck(false), dabb.WithLogger(quiet))
	defer s.Close()
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	addr, done := serveGated(t, s)
	awaitEntered(t, reg, "register "+probeDesc.Name)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := call(ctx, newClient(t, addr), "echo"); err != nil {
		t.Fatalf("a call while the first publishing attempt waits: %v", err)
	}
	close(reg.hold)
	select {
	case <-reg.registered:
	case <-time.After(testTimeout):
		t.Fatal("not published once the registry answered")
	}
	shutdownWithdraws(t, s, reg, done)
}

// shutdownWithdraws shuts s down and checks that nothing stays published
// in reg and that Serve (its result on done) returned ErrServerClosed.
func shutdownWithdraws(t *testing.T, s *dabb.Server, reg *gatedRegistry, done <-chan error) {
	t.Helper()
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if n := reg.count(); n != 0 {
		t.Errorf("%d instance(s) still published after Shutdown", n)
	}
	if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
		t.Errorf("Serve = %v", err)
	}
}

// TestShutdownStopsBackgroundPublishing: a Shutdown while the registry is
// still unreachable ends the background publishing; nothing is published
// afterwards.
func TestShutdownStopsBackgroundPublishing(t *testing.T) {
	reg := newGatedRegistry("")
	reg.down.Store(1 << 30)
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithRegistryCheck(false), dabb.WithLogger(quiet))
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	_, done := serveGated(t, s)
	awaitEntered(t, reg, "register "+probeDesc.Name)
	awaitEntered(t, reg, "register "+probeDesc.Name) // a background attempt
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
		t.Errorf("Serve = %v", err)
	}
	reg.down.Store(0) // the registry is back: nothing may publish now
	select {
	case got := <-reg.entered:
		t.Errorf("registry call %q after Shutdown returned", got)
	case <-time.After(300 * time.Millisecond): // a bound on what must not happen
	}
}

// TestBackgroundPublishingStopsOnRefusal: background publishing ends when
// the registry answers but refuses the instance (retrying cannot help): it
// logs the error once and the server goes on serving, unpublished.
func TestBackgroundPublishingStopsOnRefusal(t *testing.T) {
	reg := newGatedRegistry("")
	reg.down.Store(1)
	logs := make(chan string, 16)
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithRegistryCheck(false), dabb.WithLogger(slog.New(chanHandler(logs))))
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	addr, done := serveGated(t, s)
	awaitEntered(t, reg, "register "+probeDesc.Name) // Serve's own attempt: unreachable
	reg.mu.Lock()
	reg.refuse = probeDesc.Name
	reg.mu.Unlock()
	awaitEntered(t, reg, "register "+probeDesc.Name) // the background attempt: refused
	for msg := "dabb: publishing failed; serving unpublished"; ; {
		select {
		case got := <-logs:
			if got != msg {
				continue
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no log %q after the registry refused", msg)
		}
		break
	}
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the server stopped accepting when publishing failed: %v", err)
	}
	c.Close()
	select {
	case got := <-reg.entered:
		t.Errorf("registry call %q after a refusal: publishing goes on", got)
	case err := <-done:
		t.Fatalf("Serve returned %v", err)
	case <-time.After(600 * time.Millisecond): // past the next backoff (at most 400 ms): must not happen
	}
	if err := s.Shutdown(context.Background()); err != nil {
		t.Errorf("Shutdown: %v", err)
	}
	if err := <-done; !errors.Is(err, dabb.ErrServerClosed) {
		t.Errorf("Serve = %v", err)
	}
}

// chanHandler is a slog.Handler sending each record's message to a
// channel (dropping it when the channel is full).
type chanHandler chan<- string

func (h chanHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h chanHandler) Handle(_ context.Context, r slog.Record) error {
	select {
	case h <- r.Message:
	default:
	}
	return nil
}
func (h chanHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h chanHandler) WithGroup(string) slog.Handler      { return h }

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

// deregisterFails is a registry whose Deregister fails with errWithdraw.
type deregisterFails struct{ *gatedRegistry }

var errWithdraw = errors.New("registry refuses to withdraw")

func (deregisterFails) Deregister(context.Context, registry.Instance) error { return errWithdraw }

// TestShutdownAndCloseReturnWithdrawalErrorItself: when withdrawing fails
// and nothing else does, Shutdown and Close return the withdrawal's error,
// not a join wrapping it alone.
func TestShutdownAndCloseReturnWithdrawalErrorItself(t *testing.T) {
	for name, stop := range map[string]func(*dabb.Server) error{
		"Shutdown": func(s *dabb.Server) error { return s.Shutdown(context.Background()) },
		"Close":    (*dabb.Server).Close,
	} {
		t.Run(name, func(t *testing.T) {
			reg := deregisterFails{newGatedRegistry("")}
			s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet))
			if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
				t.Fatal(err)
			}
			addr, done := serveGated(t, s)
			awaitEntered(t, reg.gatedRegistry, "register "+probeDesc.Name)
			// Serve answers once it has published (a shutdown while it
			// publishes ends differently: TestServeShutDownWhilePublishingLeavesNothing).
			ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
			defer cancel()
			if _, err := call(ctx, newClient(t, addr), "echo"); err != nil {
				t.Fatalf("a call to the serving server: %v", err)
			}
			err := stop(s)
			if !errors.Is(err, errWithdraw) {
				t.Errorf("%s = %v, want the withdrawal's error", name, err)
			}
			if joined(err) {
				t.Errorf("%s returned %v wrapped in a join of one", name, err)
			}
			if err := <-done; err != dabb.ErrServerClosed { // the identity is the point
				t.Errorf("Serve = %v, want ErrServerClosed", err)
			}
		})
	}
}

// serverWithDeadEtcd returns a server (with opts) whose registry is an
// etcd nobody listens at, and a listener for it.
func serverWithDeadEtcd(t *testing.T, opts ...dabb.Option) (*dabb.Server, net.Listener) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	reg := openRegistry(t, "etcd://"+dead+"/services?timeout=500ms&dial_timeout=200ms")
	s := dabb.NewServer(append([]dabb.Option{dabb.WithRegistry(reg), dabb.WithLogger(quiet)}, opts...)...)
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return s, sl
}

// TestServeFailsWhenRegistryIsDown: a server that cannot publish itself
// says so at start, within the registry's request timeout, instead of
// serving unseen; its listener is closed.
func TestServeFailsWhenRegistryIsDown(t *testing.T) {
	s, sl := serverWithDeadEtcd(t)
	start := time.Now()
	err := s.Serve(sl)
	if err == nil || !strings.Contains(err.Error(), "publish test.Probe") {
		t.Fatalf("Serve with the registry down returned %v, want a publish error", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("Serve took %v to give up", el)
	}
	if c, err := net.DialTimeout("tcp", sl.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener is still open after Serve failed")
	}
	s.Close()
}

// TestServeWhileEtcdIsDown: with WithRegistryCheck(false), a server whose
// etcd cannot be reached serves anyway and keeps publishing in the
// background (etcd's errors count as unreachable); Close ends it, and the
// listener with it.
func TestServeWhileEtcdIsDown(t *testing.T) {
	s, sl := serverWithDeadEtcd(t, dabb.WithRegistryCheck(false))
	done := make(chan error, 1)
	go func() { done <- s.Serve(sl) }()
	c, err := net.DialTimeout("tcp", sl.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatalf("the server does not accept while etcd is down: %v", err)
	}
	c.Close()
	// The first publishing attempt takes the registry's 500 ms timeout;
	// Serve has not given up by well after it.
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v with etcd down, want it serving", err)
	case <-time.After(2 * time.Second): // a bound on what must not happen
	}
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("Serve after Close = %v, want ErrServerClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	if c, err := net.DialTimeout("tcp", sl.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener is still open after Close")
	}
}

// TestAdvertiseAddr: the address published is the configured one, else
// the listener's with an unspecified host replaced by a real one.
func TestAdvertiseAddr(t *testing.T) {
	tests := []struct {
		name       string
		configured string
		listen     *net.TCPAddr
		exact      string // the exact answer, or "" for "a real host, same port"
	}{
		{"configured wins", "10.1.2.3:9000", &net.TCPAddr{IP: net.IPv4zero, Port: 20880}, "10.1.2.3:9000"},
		{"specific host kept", "", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 20880}, "127.0.0.1:20880"},
		{"0.0.0.0 replaced", "", &net.TCPAddr{IP: net.IPv4zero, Port: 20880}, ""},
		{":: replaced", "", &net.TCPAddr{IP: net.IPv6unspecified, Port: 20881}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := dabb.AdvertiseAddr(tt.configured, tt.listen)
			if err != nil {
				t.Fatal(err)
			}
			if tt.exact != "" {
				if got != tt.exact {
					t.Fatalf("got %q, want %q", got, tt.exact)
				}
				return
			}
			host, port, err := net.SplitHostPort(got)
			if err != nil {
				t.Fatalf("%q: %v", got, err)
			}
			if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
				t.Fatalf("advertised %q: the host must be a real address", got)
			}
			if port != "20880" && port != "20881" {
				t.Fatalf("advertised %q: the port changed", got)
			}
		})
	}
}

// TestServiceMetadataPublished: a ServiceDesc's Metadata is published with
// its instances over the server's WithInstance metadata, and a service
// without any publishes the server's alone.
func TestServiceMetadataPublished(t *testing.T) {
	reg := newGatedRegistry("")
	withMeta, plain := probeDesc, probeDesc
	withMeta.Name, plain.Name = "test.ProbeMeta", "test.ProbePlain"
	withMeta.Metadata = map[string]string{"shared": "service", "own": "yes"}
	server := map[string]string{"shared": "server", "zone": "a"}
	s := dabb.NewServer(dabb.WithRegistry(reg), dabb.WithLogger(quiet), dabb.WithInstance(0, server))
	defer s.Close()
	for _, d := range []*dabb.ServiceDesc{&withMeta, &plain} {
		if err := s.RegisterService(d, newProbe()); err != nil {
			t.Fatal(err)
		}
	}
	_, done := serveGated(t, s)
	for range 2 {
		select {
		case <-reg.registered:
		case <-time.After(10 * time.Second):
			t.Fatal("the services were not published within 10s")
		}
	}
	reg.mu.Lock()
	gotMeta, gotPlain := reg.live[withMeta.Name].Metadata, reg.live[plain.Name].Metadata
	reg.mu.Unlock()
	want := map[string]string{"shared": "service", "own": "yes", "zone": "a"}
	if !maps.Equal(gotMeta, want) {
		t.Errorf("%s published metadata %v, want %v", withMeta.Name, gotMeta, want)
	}
	if !maps.Equal(gotPlain, server) {
		t.Errorf("%s published metadata %v, want the server's %v", plain.Name, gotPlain, server)
	}
	if server["shared"] != "server" || len(withMeta.Metadata) != 2 {
		t.Errorf("publishing changed the maps it was given: server %v, service %v", server, withMeta.Metadata)
	}
	shutdownWithdraws(t, s, reg, done)
}
