package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
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

func TestCacheSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	st := static.New(inst("a.A", "1"), inst("b.B", "9"))
	defer st.Close()

	c1 := newCache(t, st, registry.CacheConfig{SnapshotPath: path})
	pushes := subscribe(t, c1, "a.A")
	expectPush(t, pushes, "1")
	lookup(t, c1, "b.B")
	mustRegister(t, st, inst("a.A", "2"))
	expectPush(t, pushes, "1,2")
	eventually(t, "the snapshot to hold a.A's new list", func() bool {
		return strings.Contains(readFile(t, path), `"id": "2"`)
	})
	c1.Close()

	var f struct {
		Version  int                            `json:"version"`
		Services map[string][]registry.Instance `json:"services"`
	}
	if err := json.Unmarshal([]byte(readFile(t, path)), &f); err != nil {
		t.Fatalf("snapshot is not JSON: %v", err)
	}
	if f.Version != 1 || idsOf(f.Services["a.A"]) != "1,2" || idsOf(f.Services["b.B"]) != "9" {
		t.Fatalf("snapshot = %+v, want version 1 with a.A [1,2] and b.B [9]", f)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("directory holds %d files, want only the snapshot (no temporary files left)", len(entries))
	}

	// A new process during an outage starts from the snapshot.
	down := newFault(st)
	down.setDown(true)
	c2 := newCache(t, down, registry.CacheConfig{SnapshotPath: path, InitialTimeout: time.Second})
	start := time.Now()
	if got := idsOf(lookup(t, c2, "a.A")); got != "1,2" {
		t.Fatalf("Instances from the snapshot = [%s], want [1,2]", got)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("falling back to the snapshot took %v although the registry failed at once", took)
	}
	if !c2.Stale("a.A") {
		t.Fatal("Stale = false for instances read from the snapshot")
	}
	if _, err := c2.Instances(context.Background(), "c.C"); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Instances of a service missing from the snapshot = %v, want ErrUnavailable", err)
	}

	// The registry comes back: the snapshot's list gives way to it.
	pushes2 := subscribe(t, c2, "a.A")
	expectPush(t, pushes2, "1,2")
	mustDeregister(t, st, inst("a.A", "1"))
	down.setDown(false)
	expectPush(t, pushes2, "2")
	if c2.Stale("a.A") {
		t.Fatal("Stale = true after the registry answered")
	}
}

// TestCacheSnapshotThenEmptyAnswer: instances from the snapshot that the
// registry, once it answers, does not list are kept (ProtectEmpty) as
// suspect and stay stale: the registry never confirmed them. Its first
// non-empty list clears both.
func TestCacheSnapshotThenEmptyAnswer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	if err := os.WriteFile(path, []byte(`{"version":1,"services":{"a.A":[{"service":"a.A","id":"1","addr":"127.0.0.1:1"}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	st := static.New()
	defer st.Close()
	f := newFault(st)
	f.setDown(true)
	c := newCache(t, f, registry.CacheConfig{SnapshotPath: path, InitialTimeout: 50 * time.Millisecond})
	if got := idsOf(lookup(t, c, "a.A")); got != "1" {
		t.Fatalf("Instances from the snapshot = [%s], want [1]", got)
	}
	if !c.Stale("a.A") || c.Suspect("a.A") {
		t.Fatalf("from the snapshot: Stale = %v, Suspect = %v; want true, false", c.Stale("a.A"), c.Suspect("a.A"))
	}
	pushes := subscribe(t, c, "a.A")
	expectPush(t, pushes, "1")

	f.setDown(false) // the registry answers: no instances of a.A
	eventually(t, "Suspect after the registry's empty answer", func() bool { return c.Suspect("a.A") })
	if got := idsOf(lookup(t, c, "a.A")); got != "1" {
		t.Fatalf("Instances after the empty answer = [%s], want the snapshot's [1] kept", got)
	}
	if !c.Stale("a.A") {
		t.Fatal("Stale = false for the snapshot's instances, which the registry has not confirmed")
	}

	mustRegister(t, st, inst("a.A", "2"))
	expectPush(t, pushes, "2")
	if c.Stale("a.A") || c.Suspect("a.A") {
		t.Fatalf("after a list from the registry: Stale = %v, Suspect = %v; want both false", c.Stale("a.A"), c.Suspect("a.A"))
	}
}

// TestSnapshotSharedPath: two caches (or processes) sharing a snapshot
// file keep each other's services: each write takes the services it does
// not follow from the file as it is then.
func TestSnapshotSharedPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	st := static.New(inst("x.X", "1"), inst("y.Y", "1"))
	defer st.Close()
	cfg := registry.CacheConfig{SnapshotPath: path}
	c1, c2 := newCache(t, st, cfg), newCache(t, st, cfg)
	pushY := subscribe(t, c2, "y.Y")
	expectPush(t, pushY, "1")
	eventually(t, "c2 to save y.Y", func() bool { return strings.Contains(readFile(t, path), `"y.Y"`) })
	pushX := subscribe(t, c1, "x.X")
	expectPush(t, pushX, "1")
	eventually(t, "c1 to save x.X", func() bool { return strings.Contains(readFile(t, path), `"x.X"`) })
	mustRegister(t, st, inst("y.Y", "2"))
	expectPush(t, pushY, "1,2")
	eventually(t, "c2 to save y.Y's new list", func() bool { return strings.Contains(readFile(t, path), `"id": "2"`) })
	if got := readFile(t, path); !strings.Contains(got, `"x.X"`) {
		t.Fatalf("c2's write dropped x.X, which c1 saved:\n%s", got)
	}
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(b)
}

func TestCacheBadSnapshot(t *testing.T) {
	tests := []struct {
		name, content string
	}{
		{"NotJSON", "{not json"},
		{"WrongVersion", `{"version":99,"services":{"a.A":[{"id":"1","addr":"127.0.0.1:1"}]}}`},
		{"InvalidInstances", `{"version":1,"services":{"a.A":[{"id":"","addr":"x"}]}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "registry.json")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			st := static.New()
			defer st.Close()
			f := newFault(st)
			f.setDown(true)
			c := newCache(t, f, registry.CacheConfig{SnapshotPath: path, InitialTimeout: 50 * time.Millisecond})
			_, err := c.Instances(context.Background(), "a.A")
			if !errors.Is(err, registry.ErrUnavailable) {
				t.Fatalf("Instances with a bad snapshot = %v, want ErrUnavailable", err)
			}
		})
	}
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

func TestCacheUnsubscribeFromCallback(t *testing.T) {
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c := newCache(t, st, registry.CacheConfig{})
	lookup(t, c, "a.A")
	var calls atomic.Int32
	var unsub func()
	done := make(chan struct{})
	unsub, err := c.Subscribe("a.A", func([]registry.Instance) {
		if calls.Add(1) == 2 {
			unsub()
			close(done)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	mustRegister(t, st, inst("a.A", "2"))
	select {
	case <-done:
	case <-time.After(waitTimeout):
		t.Fatal("no second call")
	}
	mustRegister(t, st, inst("a.A", "3"))
	eventually(t, "the cache to see the third instance", func() bool { return idsOf(lookup(t, c, "a.A")) == "1,2,3" })
	if n := calls.Load(); n != 2 {
		t.Fatalf("callback called %d times, want 2 (none after unsubscribing)", n)
	}
}

// TestCacheCloseFromCallback: a subscriber may close the cache, from its
// first call (made by Subscribe on the caller's goroutine) or from a later
// one (made by the service's watch goroutine). Close returns, no call
// follows, and every goroutine of the cache ends.
func TestCacheCloseFromCallback(t *testing.T) {
	tests := []struct {
		name   string
		onCall int32 // the call that closes the cache
	}{
		{"FirstCall", 1},
		{"LaterCall", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := goleak.IgnoreCurrent()
			st := static.New(inst("a.A", "1"))
			defer st.Close()
			c := registry.NewCache(st, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler)})
			lookup(t, c, "a.A")
			var calls atomic.Int32
			closed := make(chan error, 1)
			_, err := c.Subscribe("a.A", func([]registry.Instance) {
				if calls.Add(1) == tt.onCall {
					closed <- c.Close()
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			mustRegister(t, st, inst("a.A", "2"))
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close from call %d of the subscriber: %v", tt.onCall, err)
				}
			case <-time.After(waitTimeout):
				t.Fatalf("Close from call %d of the subscriber did not return within %v", tt.onCall, waitTimeout)
			}
			if _, err := c.Instances(context.Background(), "a.A"); !errors.Is(err, registry.ErrClosed) {
				t.Fatalf("Instances after Close = %v, want ErrClosed", err)
			}
			mustRegister(t, st, inst("a.A", "3"))
			// goleak waits for the cache's goroutines to end; once they
			// have, no call can come any more.
			goleak.VerifyNone(t, before)
			if n := calls.Load(); n != tt.onCall {
				t.Fatalf("subscriber called %d times, want %d (none after Close)", n, tt.onCall)
			}
		})
	}
}

// TestCacheCloseDoesNotWaitForSubscribers: Close does not wait for a
// subscriber's call in progress (which may itself be calling Close), and
// no subscriber is called once Close has returned.
func TestCacheCloseDoesNotWaitForSubscribers(t *testing.T) {
	st := static.New(inst("b.B", "1"))
	defer st.Close()
	c := newCache(t, st, registry.CacheConfig{})
	lookup(t, c, "b.B")
	inB, releaseB := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	_, err := c.Subscribe("b.B", func(ins []registry.Instance) {
		calls.Add(1)
		if len(ins) == 2 {
			close(inB)
			<-releaseB
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer close(releaseB)
	mustRegister(t, st, inst("b.B", "2"))
	select {
	case <-inB:
	case <-time.After(waitTimeout):
		t.Fatal("b.B's subscriber was not called within 2s")
	}
	closeWithin(t, c, "Close waited for a subscriber's call in progress")
	before := calls.Load()
	mustRegister(t, st, inst("b.B", "3"))
	time.Sleep(100 * time.Millisecond) // a bound on what must not happen
	if n := calls.Load(); n != before {
		t.Errorf("a subscriber was called %d more time(s) after Close returned", n-before)
	}
}

// TestCacheCloseFromFirstCallWhileWatchDelivers: Close called by the
// first call of a subscriber (on Subscribe's goroutine) returns although
// the watch goroutine is waiting to call the same subscriber with a newer
// list: that call is dropped.
func TestCacheCloseFromFirstCallWhileWatchDelivers(t *testing.T) {
	before := goleak.IgnoreCurrent()
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c := registry.NewCache(st, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler)})
	// A subscriber from before the first list: once it has that list,
	// the watch goroutine is done with it and with its subscribers.
	first := make(chan struct{}, 10)
	if _, err := c.Subscribe("a.A", func([]registry.Instance) { first <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	case <-time.After(waitTimeout):
		t.Fatal("no first list within 2s")
	}
	var calls atomic.Int32
	closed := make(chan error, 1)
	go func() {
		_, err := c.Subscribe("a.A", func([]registry.Instance) {
			if calls.Add(1) > 1 {
				return
			}
			// The watch goroutine takes the new list, then waits to
			// deliver it to this subscriber, busy here.
			if err := st.Register(context.Background(), inst("a.A", "2")); err != nil {
				closed <- err
				return
			}
			deadline := time.Now().Add(waitTimeout)
			for ins, _ := c.Instances(context.Background(), "a.A"); idsOf(ins) != "1,2"; ins, _ = c.Instances(context.Background(), "a.A") {
				if time.Now().After(deadline) {
					closed <- fmt.Errorf("the cache holds [%s] after %v, want [1,2]", idsOf(ins), waitTimeout)
					return
				}
				time.Sleep(time.Millisecond)
			}
			closed <- c.Close()
		})
		if err != nil {
			closed <- err
		}
	}()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close from the first call: %v", err)
		}
	case <-time.After(2 * waitTimeout):
		t.Fatalf("Close from the first call did not return within %v", 2*waitTimeout)
	}
	goleak.VerifyNone(t, before)
	if n := calls.Load(); n != 1 {
		t.Fatalf("subscriber called %d times, want once (the newer list is dropped at Close)", n)
	}
}

// hangingRegistry never answers a Watch until its context ends: a
// registry whose client keeps trying to connect (etcd's dials, say)
// rather than failing at once.
type hangingRegistry struct{ registry.Registry }

func (hangingRegistry) Watch(ctx context.Context, _ string) (registry.Watcher, error) {
	<-ctx.Done()
	return nil, fmt.Errorf("hanging: %w", registry.ErrUnavailable)
}

// TestCacheSnapshotForShortDeadline: a first lookup whose caller has less
// time than InitialTimeout falls back to the snapshot after half of it,
// rather than spending it all waiting for a registry that does not answer
// (a process started during an outage, calling methods with short
// timeouts).
func TestCacheSnapshotForShortDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c1 := newCache(t, st, registry.CacheConfig{SnapshotPath: path})
	lookup(t, c1, "a.A")
	c1.Close()

	c2 := newCache(t, hangingRegistry{st}, registry.CacheConfig{SnapshotPath: path, InitialTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ins, err := c2.Instances(ctx, "a.A")
	if err != nil {
		t.Fatalf("a lookup with 200ms left, the registry hanging and a snapshot at hand = %v", err)
	}
	if idsOf(ins) != "1" || !c2.Stale("a.A") {
		t.Fatalf("Instances = [%s] (stale %v), want the snapshot's [1], stale", idsOf(ins), c2.Stale("a.A"))
	}
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
