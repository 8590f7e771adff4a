package etcd

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

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
