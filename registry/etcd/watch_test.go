package etcd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/registry"
)

// TestCacheAcrossOutage: the client cache over a real etcd keeps its list
// while etcd is down, a new process starts from the snapshot during the
// outage, and both follow etcd again once it is back.
func TestCacheAcrossOutage(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	provider := newRegistry(t, srv, Config{})
	svc := service(t)
	ctx := ctxFor(t, 30*time.Second)
	if err := provider.Register(ctx, registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	snapshot := filepath.Join(t.TempDir(), "registry.json")
	cacheCfg := registry.CacheConfig{
		SnapshotPath:   snapshot,
		InitialTimeout: 3 * time.Second,
		MinRetryDelay:  50 * time.Millisecond,
		MaxRetryDelay:  200 * time.Millisecond,
		Logger:         quiet,
	}
	c1 := registry.NewCache(newRegistry(t, srv, Config{RequestTimeout: 500 * time.Millisecond}), cacheCfg)
	defer c1.Close()
	pushes := make(chan string, 10)
	unsub, err := c1.Subscribe(svc, func(ins []registry.Instance) { pushes <- strings.Join(ids(ins), ",") })
	if err != nil {
		t.Fatal(err)
	}
	defer unsub()
	expect := func(want string) {
		t.Helper()
		select {
		case got := <-pushes:
			if got != want {
				t.Fatalf("cache pushed [%s], want [%s]", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("cache pushed nothing within 5s, want [%s]", want)
		}
	}
	expect("a")

	srv.Stop()
	waitFor(t, 5*time.Second, "the cache to notice the outage", func() bool { return c1.Stale(svc) })
	if ins, err := c1.Instances(ctx, svc); err != nil || strings.Join(ids(ins), ",") != "a" {
		t.Fatalf("Instances during the outage = %v, %v; want the last known [a]", ids(ins), err)
	}

	// A new process, started during the outage, calls from the snapshot.
	c2 := registry.NewCache(newRegistry(t, srv, Config{RequestTimeout: 500 * time.Millisecond}), cacheCfg)
	defer c2.Close()
	start := time.Now()
	ins, err := c2.Instances(ctx, svc)
	if err != nil || strings.Join(ids(ins), ",") != "a" {
		t.Fatalf("new cache during the outage = %v, %v; want [a] from the snapshot", ids(ins), err)
	}
	if took := time.Since(start); took > cacheCfg.InitialTimeout+time.Second {
		t.Errorf("the snapshot fallback took %v", took)
	}
	if !c2.Stale(svc) {
		t.Error("Stale = false for instances from the snapshot")
	}

	srv.Start(t)
	if err := provider.Register(ctx, registry.Instance{Service: svc, ID: "b", Addr: "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	expect("a,b")
	waitFor(t, 5*time.Second, "the new cache to follow etcd", func() bool {
		ins, err := c2.Instances(ctx, svc)
		return err == nil && strings.Join(ids(ins), ",") == "a,b" && !c2.Stale(svc)
	})
	if c1.Stale(svc) {
		t.Error("Stale = true after etcd came back")
	}
}

// firstLookup makes a new cache's first lookup of a new service through r
// and returns its error, which must wrap registry.ErrUnavailable.
func firstLookup(t *testing.T, r *Registry, cfg registry.CacheConfig) error {
	t.Helper()
	cfg.Logger = quiet
	c := registry.NewCache(r, cfg)
	defer c.Close()
	ins, err := c.Instances(ctxFor(t, 10*time.Second), service(t))
	if err == nil {
		t.Fatalf("Instances = %v, want an error", ids(ins))
	}
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Instances = %v, want an error wrapping registry.ErrUnavailable", err)
	}
	return err
}

// TestCacheSaysEtcdUnreachable: the first lookup of a service while etcd
// refuses connections (stopped after the client had connected, or never
// there) says that it could not be reached, naming its address: the
// client retries on its own, so the watch has not failed by then, and "no
// answer" would not tell an unreachable etcd from a slow one.
func TestCacheSaysEtcdUnreachable(t *testing.T) {
	t.Parallel()
	check := func(t *testing.T, r *Registry, addr string) {
		t.Helper()
		// Defaults: RequestTimeout 3 s, InitialTimeout 500 ms.
		err := firstLookup(t, r, registry.CacheConfig{})
		msg := err.Error()
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(msg, "could not be reached") || !strings.Contains(msg, addr) || strings.Contains(msg, "no answer") {
			t.Fatalf("Instances with etcd at %s refusing connections = %q; want it to say that %s could not be reached (wrapping ErrUnavailable)", addr, msg, addr)
		}
		t.Logf("%v", err)
	}
	t.Run("stopped", func(t *testing.T) {
		srv := etcdtest.Start(t)
		r := newRegistry(t, srv, Config{})
		w, err := r.Watch(ctxFor(t, 10*time.Second), service(t))
		if err != nil {
			t.Fatal(err)
		}
		w.Stop()
		srv.Stop()
		check(t, r, srv.Endpoint())
	})
	t.Run("nothing listening", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := l.Addr().String()
		l.Close()
		r, err := New(Config{Endpoints: []string{addr}, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		check(t, r, addr)
	})
}

// TestCacheSaysSilentEtcdDidNotAnswer: with the client connected but etcd
// not answering (hung, or the path silent), the first lookup says that it
// did not answer, not that it could not be reached.
func TestCacheSaysSilentEtcdDidNotAnswer(t *testing.T) {
	t.Parallel()
	p := startFreezingProxy(t, etcdtest.Shared(t).Endpoint())
	// The client's keepalive notices a silent path after 15 s: well after
	// the lookup.
	r, err := New(Config{Endpoints: []string{p.addr()}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	w, err := r.Watch(ctxFor(t, 10*time.Second), service(t))
	if err != nil {
		t.Fatal(err)
	}
	w.Stop()
	p.freeze()
	err = firstLookup(t, r, registry.CacheConfig{InitialTimeout: 300 * time.Millisecond})
	if msg := err.Error(); !strings.Contains(msg, "no answer within 300ms") || strings.Contains(msg, "could not be reached") {
		t.Fatalf("Instances with etcd connected but silent = %q; want it to say there was no answer within 300ms", msg)
	}
}

// TestWatcherAcrossOutage: while etcd is down a watcher reports the outage
// once and never an empty set; once etcd is back it returns the full set,
// with the changes made meanwhile.
func TestWatcherAcrossOutage(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	provider := newRegistry(t, srv, Config{})
	consumer := newRegistry(t, srv, Config{RequestTimeout: time.Second})
	svc := service(t)
	ctx := ctxFor(t, 30*time.Second)
	if err := provider.Register(ctx, registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	w, err := consumer.Watch(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "before the outage", "a")

	srv.Stop()
	nctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	got, err := w.Next(nctx)
	cancel()
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Next during the outage = %v, %v; want an error wrapping ErrUnavailable", ids(got), err)
	}
	nctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	got, err = w.Next(nctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("second Next during the outage = %v, %v; want it to block", ids(got), err)
	}

	srv.Start(t)
	if err := provider.Register(ctx, registry.Instance{Service: svc, ID: "b", Addr: "127.0.0.1:2"}); err != nil {
		t.Fatal(err)
	}
	waitSet(t, w, 5*time.Second, "after etcd is back", "a", "b")
	if err := provider.Deregister(ctx, registry.Instance{Service: svc, ID: "a"}); err != nil {
		t.Fatal(err)
	}
	waitSet(t, w, time.Second, "a change after the outage", "b")
}

// TestCompactionRelists compacts past the revision a watcher is about to
// watch from; the watcher must list again and see the changes.
func TestCompactionRelists(t *testing.T) {
	srv := etcdtest.Shared(t)
	provider := newRegistry(t, srv, Config{})
	consumer := newRegistry(t, srv, Config{})
	cli := newClient(t, srv)
	svc := service(t)
	ctx := ctxFor(t, 20*time.Second)

	var lists atomic.Int32
	hookErr := make(chan error, 1)
	relisted := make(chan struct{})
	consumer.testHookAfterList = func(string) {
		switch lists.Add(1) {
		case 1:
		case 2:
			close(relisted)
			return
		default:
			return
		}
		// Between the first list and the watch: change the service and
		// compact, so the watch from the listed revision + 1 is refused.
		err := provider.Register(ctx, registry.Instance{Service: svc, ID: "late", Addr: "127.0.0.1:9"})
		if err == nil {
			// One more revision, so that the compaction covers the
			// registration's revision too.
			var resp *clientv3.PutResponse
			if resp, err = cli.Put(ctx, "/compaction-probe/"+svc, "x"); err == nil {
				_, err = cli.Compact(ctx, resp.Header.Revision, clientv3.WithCompactPhysical())
			}
		}
		hookErr <- err
	}
	w, err := consumer.Watch(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "first list")
	select {
	case err := <-hookErr:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the watcher never reached its watch")
	}
	waitSet(t, w, 2*time.Second, "after the compaction", "late")
	// The hook runs after a list has replaced the set, so the set can
	// show "late" just before the second call: wait for that call.
	select {
	case <-relisted:
	case <-time.After(2 * time.Second):
		t.Fatalf("watcher listed %d times, want a second list after the compaction", lists.Load())
	}
}

// TestWatcherSetFollowsEvents: the watcher's set stays sorted by ID across
// puts, replacements, deletions and puts of the same value; Next returns a
// copy when the set changed and sees no change in a put of the same value
// nor in a change undone before it ran.
func TestWatcherSetFollowsEvents(t *testing.T) {
	w := &watcher{
		r:       &Registry{log: slog.New(slog.DiscardHandler)},
		service: "a.A",
		prefix:  "/services/a.A/",
		changed: make(chan struct{}),
		synced:  true,
		fresh:   true,
	}
	put := func(id, addr, version string) *clientv3.Event {
		v := fmt.Sprintf(`{"addr":%q,"metadata":{"version":%q}}`, addr, version)
		return &clientv3.Event{Type: clientv3.EventTypePut, Kv: &mvccpb.KeyValue{Key: []byte(w.prefix + id), Value: []byte(v)}}
	}
	del := func(id string) *clientv3.Event {
		return &clientv3.Event{Type: clientv3.EventTypeDelete, Kv: &mvccpb.KeyValue{Key: []byte(w.prefix + id)}}
	}
	next := func(want ...string) []registry.Instance {
		t.Helper()
		if !w.fresh && !w.changedLocked() {
			t.Fatalf("no change seen; want %v", want)
		}
		set, err := w.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		var got []string
		for _, in := range set {
			got = append(got, in.ID+"@"+in.Addr+"/"+in.Metadata["version"])
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Next = %v, want %v", got, want)
		}
		return set
	}
	unchanged := func(what string) {
		t.Helper()
		if w.changedLocked() {
			t.Fatalf("after %s: the watcher sees a change", what)
		}
	}

	next()
	w.apply([]*clientv3.Event{put("c", "h:3", "1"), put("a", "h:1", "1"), put("b", "h:2", "1")})
	first := next("a@h:1/1", "b@h:2/1", "c@h:3/1")
	first[0].Addr = "mine" // the caller's to change

	w.apply([]*clientv3.Event{put("b", "h:2", "1")})
	unchanged("a put of the same value")

	w.apply([]*clientv3.Event{put("b", "h:9", "2")})
	second := next("a@h:1/1", "b@h:9/2", "c@h:3/1")
	if !registry.SameInstance(second[2], registry.Instance{Service: "a.A", ID: "c", Addr: "h:3", Metadata: map[string]string{"version": "1"}}) {
		t.Fatalf("c = %+v", second[2])
	}

	w.apply([]*clientv3.Event{del("a"), del("zz"), put("d", "h:4", "1")})
	next("b@h:9/2", "c@h:3/1", "d@h:4/1")

	w.apply([]*clientv3.Event{put("e", "h:5", "1")})
	w.apply([]*clientv3.Event{del("e")})
	w.apply([]*clientv3.Event{put("c", "h:0", "1")})
	w.apply([]*clientv3.Event{put("c", "h:3", "1")})
	unchanged("changes undone")

	w.apply([]*clientv3.Event{put("0", "h:0", "1"), del("d")})
	next("0@h:0/1", "b@h:9/2", "c@h:3/1")
	if w.set[0].Addr != "h:0" || len(w.before) != 0 {
		t.Fatalf("set %v, before %v after Next", w.set, w.before)
	}
}
