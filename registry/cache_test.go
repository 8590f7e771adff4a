package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

const waitTimeout = 2 * time.Second

// faultRegistry wraps a registry: it counts Watch calls and, while down,
// fails Watch and ends every Next with an error, as an unreachable
// registry does.
type faultRegistry struct {
	registry.Registry

	watchCalls atomic.Int32
	watched    chan string // receives the service of each Watch call, if not full

	mu      sync.Mutex // guards following
	down    bool
	downSig chan struct{} // closed when the registry goes down
}

var errInjected = fmt.Errorf("injected outage: %w", registry.ErrUnavailable)

func newFault(r registry.Registry) *faultRegistry {
	return &faultRegistry{Registry: r, watched: make(chan string, 100), downSig: make(chan struct{})}
}

func (f *faultRegistry) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if down == f.down {
		return
	}
	f.down = down
	if down {
		close(f.downSig)
	} else {
		f.downSig = make(chan struct{})
	}
}

func (f *faultRegistry) state() (bool, <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.down, f.downSig
}

func (f *faultRegistry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	f.watchCalls.Add(1)
	select {
	case f.watched <- service:
	default:
	}
	if down, _ := f.state(); down {
		return nil, errInjected
	}
	w, err := f.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	return &faultWatcher{Watcher: w, f: f}, nil
}

type faultWatcher struct {
	registry.Watcher
	f *faultRegistry
}

func (w *faultWatcher) Next(ctx context.Context) ([]registry.Instance, error) {
	down, sig := w.f.state()
	if down {
		return nil, errInjected
	}
	ctx2, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-sig:
			cancel()
		case <-ctx2.Done():
		}
	}()
	set, err := w.Watcher.Next(ctx2)
	if err != nil && ctx.Err() == nil {
		if down, _ := w.f.state(); down {
			return nil, errInjected
		}
	}
	return set, err
}

// logCounter counts log records by message.
type logCounter struct {
	mu   sync.Mutex
	msgs map[string]int
}

func (l *logCounter) Enabled(context.Context, slog.Level) bool { return true }
func (l *logCounter) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.msgs == nil {
		l.msgs = make(map[string]int)
	}
	l.msgs[r.Message]++
	return nil
}
func (l *logCounter) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logCounter) WithGroup(string) slog.Handler      { return l }
func (l *logCounter) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for m, c := range l.msgs {
		if strings.Contains(m, substr) {
			n += c
		}
	}
	return n
}

func inst(service, id string) registry.Instance {
	return registry.Instance{Service: service, ID: id, Addr: "127.0.0.1:" + fmt.Sprint(20000+len(id))}
}

func mustRegister(t *testing.T, r registry.Registry, in registry.Instance) {
	t.Helper()
	if err := r.Register(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

func mustDeregister(t *testing.T, r registry.Registry, in registry.Instance) {
	t.Helper()
	if err := r.Deregister(context.Background(), in); err != nil {
		t.Fatal(err)
	}
}

func newCache(t *testing.T, r registry.Registry, cfg registry.CacheConfig) *registry.Cache {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MinRetryDelay == 0 {
		cfg.MinRetryDelay, cfg.MaxRetryDelay = 5*time.Millisecond, 20*time.Millisecond
	}
	c := registry.NewCache(r, cfg)
	t.Cleanup(func() { c.Close() })
	return c
}

func lookup(t *testing.T, c *registry.Cache, service string) []registry.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
	defer cancel()
	ins, err := c.Instances(ctx, service)
	if err != nil {
		t.Fatalf("Instances(%s): %v", service, err)
	}
	return ins
}

func idsOf(ins []registry.Instance) string {
	ids := make([]string, len(ins))
	for i, in := range ins {
		ids[i] = in.ID
	}
	return strings.Join(ids, ",")
}

// eventually polls a condition of the cache, which changes in its watch
// goroutine without an event the test can wait on.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, waitTimeout, 2*time.Millisecond, what, cond)
}

// subscribe returns a channel that receives every list the cache
// publishes for service.
func subscribe(t *testing.T, c *registry.Cache, service string) <-chan string {
	t.Helper()
	ch := make(chan string, 100)
	unsub, err := c.Subscribe(service, func(ins []registry.Instance) { ch <- idsOf(ins) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unsub)
	return ch
}

func expectPush(t *testing.T, ch <-chan string, want string) {
	t.Helper()
	select {
	case got := <-ch:
		if got != want {
			t.Fatalf("subscriber got [%s], want [%s]", got, want)
		}
	case <-time.After(waitTimeout):
		t.Fatalf("subscriber got nothing within %v, want [%s]", waitTimeout, want)
	}
}

func TestCacheOneWatchPerService(t *testing.T) {
	st := static.New(inst("a.A", "1"), inst("b.B", "2"))
	defer st.Close()
	f := newFault(st)
	c := newCache(t, f, registry.CacheConfig{})

	var wg sync.WaitGroup
	errs := make(chan error, 200)
	for i := range 200 {
		svc := "a.A"
		if i%2 == 1 {
			svc = "b.B"
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), waitTimeout)
			defer cancel()
			for range 50 {
				ins, err := c.Instances(ctx, svc)
				if err != nil {
					errs <- err
					return
				}
				if len(ins) != 1 {
					errs <- fmt.Errorf("Instances(%s) = %v", svc, ins)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if n := f.watchCalls.Load(); n != 2 {
		t.Fatalf("Watch called %d times for 2 services and 10000 lookups, want 2", n)
	}
}

func TestCacheInstancesAllocatesNothing(t *testing.T) {
	st := static.New(inst("a.A", "1"), inst("a.A", "2"))
	defer st.Close()
	c := newCache(t, st, registry.CacheConfig{})
	lookup(t, c, "a.A")
	ctx := context.Background()
	allocs := testing.AllocsPerRun(1000, func() {
		if ins, err := c.Instances(ctx, "a.A"); err != nil || len(ins) != 2 {
			panic(fmt.Sprint(ins, err))
		}
	})
	if allocs != 0 {
		t.Fatalf("Instances after the first lookup allocates %v times per call, want 0", allocs)
	}
}

func BenchmarkCacheInstances(b *testing.B) {
	st := static.New(inst("a.A", "1"), inst("a.A", "2"), inst("a.A", "3"))
	defer st.Close()
	c := registry.NewCache(st, registry.CacheConfig{})
	defer c.Close()
	ctx := context.Background()
	if _, err := c.Instances(ctx, "a.A"); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.Instances(ctx, "a.A"); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

func TestCacheUnreachableWithoutSnapshot(t *testing.T) {
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	f := newFault(st)
	f.setDown(true)
	c := newCache(t, f, registry.CacheConfig{InitialTimeout: 100 * time.Millisecond})
	start := time.Now()
	_, err := c.Instances(context.Background(), "a.A")
	if !errors.Is(err, registry.ErrUnavailable) || !strings.Contains(err.Error(), "a.A") {
		t.Fatalf("Instances = %v, want an error naming a.A and wrapping ErrUnavailable", err)
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("Instances took %v with InitialTimeout 100ms", took)
	}

	// The registry comes back: the watch that kept retrying finds it.
	f.setDown(false)
	eventually(t, "the first list after the outage", func() bool {
		ins, err := c.Instances(context.Background(), "a.A")
		return err == nil && idsOf(ins) == "1"
	})
}

func TestCacheContextEndsFirstLookup(t *testing.T) {
	st := static.New()
	defer st.Close()
	f := newFault(st)
	f.setDown(true)
	c := newCache(t, f, registry.CacheConfig{InitialTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := c.Instances(ctx, "a.A"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Instances = %v, want context.DeadlineExceeded", err)
	}
}

func TestCacheClose(t *testing.T) {
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c := registry.NewCache(st, registry.CacheConfig{})
	lookup(t, c, "a.A")
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Instances(context.Background(), "a.A"); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Instances after Close = %v, want ErrClosed", err)
	}
	if _, err := c.Subscribe("a.A", func([]registry.Instance) {}); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Subscribe after Close = %v, want ErrClosed", err)
	}
	if err := c.Close(); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}
}

func TestCacheBadInput(t *testing.T) {
	st := static.New()
	defer st.Close()
	c := newCache(t, st, registry.CacheConfig{})
	for _, svc := range []string{"", "a/b"} {
		if _, err := c.Instances(context.Background(), svc); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("Instances(%q) = %v, want ErrInvalid", svc, err)
		}
	}
	if _, err := c.Subscribe("a.A", nil); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("Subscribe with nil func = %v, want ErrInvalid", err)
	}
}

// refusingRegistry refuses every service name in Watch, as a backend
// does with a name it cannot store, and counts the calls.
type refusingRegistry struct {
	registry.Registry
	watchCalls atomic.Int32
}

var errRefused = fmt.Errorf("injected refusal: %w", registry.ErrInvalid)

func (r *refusingRegistry) Watch(context.Context, string) (registry.Watcher, error) {
	r.watchCalls.Add(1)
	return nil, errRefused
}

// hangingRegistry never answers a Watch until its context ends: a
// registry whose client keeps trying to connect (etcd's dials, say)
// rather than failing at once.
type hangingRegistry struct{ registry.Registry }

func (hangingRegistry) Watch(ctx context.Context, _ string) (registry.Watcher, error) {
	<-ctx.Done()
	return nil, fmt.Errorf("hanging: %w", registry.ErrUnavailable)
}

// TestCacheFailsFastOnceItGaveUp: once a lookup has waited InitialTimeout
// in vain (registry down, no snapshot), later lookups of the service fail
// at once with the same error, instead of each waiting again (or running
// out of their own time with another error); once the registry answers,
// lookups succeed.
func TestCacheFailsFastOnceItGaveUp(t *testing.T) {
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	f := newFault(st)
	f.setDown(true)
	c := newCache(t, f, registry.CacheConfig{InitialTimeout: 100 * time.Millisecond})
	if _, err := c.Instances(context.Background(), "a.A"); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("first lookup with the registry down = %v, want ErrUnavailable", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond) // shorter than InitialTimeout
	defer cancel()
	_, err := c.Instances(ctx, "a.A")
	if !errors.Is(err, registry.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second lookup = %v, want ErrUnavailable at once", err)
	}
	f.setDown(false)
	eventually(t, "a lookup to succeed once the registry is back", func() bool {
		ins, err := c.Instances(context.Background(), "a.A")
		return err == nil && idsOf(ins) == "1"
	})
}
