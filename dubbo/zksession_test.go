package dubbo

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

func TestCacheSaysZooKeeperUnreachable(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := newTestRegistry(t, "zookeeper://"+addr)
	c := registry.NewCache(r, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler)})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ins, err := c.Instances(ctx, "com.x.G")
	if err == nil {
		t.Fatalf("Instances = %v, want an error", ins)
	}
	// InitialTimeout (500 ms) passes before RequestTimeout (3 s): the
	// cache asks the registry, which knows its connections fail.
	if msg := err.Error(); !errors.Is(err, registry.ErrUnavailable) || !strings.Contains(msg, "could not be reached") || !strings.Contains(msg, addr) {
		t.Fatalf("Instances with nothing at %s = %q; want ErrUnavailable saying %s could not be reached", addr, msg, addr)
	}
}

// cacheConfig is the configuration of the caches below: short retry
// delays, so that a restarted ZooKeeper is found again at once.
func cacheConfig(t *testing.T, snapshot string) registry.CacheConfig {
	return registry.CacheConfig{
		SnapshotPath:   snapshot,
		InitialTimeout: 3 * time.Second,
		MinRetryDelay:  50 * time.Millisecond,
		MaxRetryDelay:  200 * time.Millisecond,
		Logger:         testLogger(t),
	}
}

// subscribe follows service in c and returns a function that waits, up to
// d, for the cache to push the addresses want (in any order).
func subscribe(t *testing.T, c *registry.Cache, service string) func(d time.Duration, step string, want ...string) {
	t.Helper()
	pushes := make(chan []string, 16)
	unsub, err := c.Subscribe(service, func(ins []registry.Instance) { pushes <- addrs(ins) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(unsub)
	return func(d time.Duration, step string, want ...string) {
		t.Helper()
		timer := time.NewTimer(d)
		defer timer.Stop()
		var last []string
		for {
			select {
			case got := <-pushes:
				if sameAddrs(got, want) {
					return
				}
				last = got
			case <-timer.C:
				t.Fatalf("%s: the cache pushed no %v within %v (last push %v)", step, want, d, last)
			}
		}
	}
}

// TestCacheAcrossZooKeeperOutage: a cache over the zookeeper:// registry
// keeps its providers while ZooKeeper is down and says they are stale once
// the session has been down for the session timeout; a new process,
// started during the outage, cold-starts from the snapshot file the first
// wrote, weights and parameters included; both follow ZooKeeper again once
// it is back.
func TestCacheAcrossZooKeeperOutage(t *testing.T) {
	srv := zktest.Start(t)
	conn := rawConn(t, srv.Addr())
	iface := ifaceFor(t)
	// Persistent nodes: this test is about the reader, not about the
	// providers' sessions across the restart.
	writeNode(t, conn, iface, categoryProviders, "dubbo://10.0.0.1:20880/"+iface+"?interface="+iface+"&application=java-app&weight=50", 0)
	const session = 2 * time.Second
	rawURL := "zookeeper://" + srv.Addr() + "?session=2000&timeout=500"
	snapshot := filepath.Join(t.TempDir(), "registry.json")

	c1 := registry.NewCache(newTestRegistry(t, rawURL), cacheConfig(t, snapshot))
	defer c1.Close()
	pushed1 := subscribe(t, c1, iface)
	pushed1(5*time.Second, "before the outage", "10.0.0.1:20880")

	stopped := time.Now() // before: the client may see the end first
	srv.Stop()
	wait.Until(t, session+5*time.Second, 10*time.Millisecond, "Cache.Stale with ZooKeeper down", func() bool { return c1.Stale(iface) })
	if down := time.Since(stopped); down < session {
		t.Fatalf("Stale after %v, before the session timeout (%v)", down, session)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if ins, err := c1.Instances(ctx, iface); err != nil || !sameAddrs(addrs(ins), []string{"10.0.0.1:20880"}) {
		t.Fatalf("Instances during the outage = %v, %v; want the last known provider", addrs(ins), err)
	}

	// A new process starts while ZooKeeper is down: its registry has
	// never had a session.
	cfg := cacheConfig(t, snapshot)
	c2 := registry.NewCache(newTestRegistry(t, rawURL), cfg)
	defer c2.Close()
	start := time.Now()
	ins, err := c2.Instances(ctx, iface)
	if err != nil || !sameAddrs(addrs(ins), []string{"10.0.0.1:20880"}) {
		t.Fatalf("a new cache during the outage = %v, %v; want the provider from the snapshot", addrs(ins), err)
	}
	if took := time.Since(start); took > cfg.InitialTimeout+time.Second {
		t.Errorf("the snapshot fallback took %v", took)
	}
	if in := ins[0]; in.Weight != 50 || in.Metadata["application"] != "java-app" || in.Metadata["interface"] != iface {
		t.Errorf("the provider from the snapshot = %+v; want weight 50 and the URL's parameters", in)
	}
	if !c2.Stale(iface) {
		t.Error("Stale = false for providers from the snapshot")
	}
	pushed2 := subscribe(t, c2, iface)
	pushed2(time.Second, "the snapshot's set", "10.0.0.1:20880")

	srv.Start(t)
	// A new client: the first may still be reconnecting, or its session
	// may have expired during the outage.
	conn = rawConn(t, srv.Addr())
	writeNode(t, conn, iface, categoryProviders, "dubbo://10.0.0.2:20880/"+iface+"?interface="+iface, 0)
	pushed1(15*time.Second, "the first cache after the restart", "10.0.0.1:20880", "10.0.0.2:20880")
	pushed2(15*time.Second, "the new cache after the restart", "10.0.0.1:20880", "10.0.0.2:20880")
	wait.Until(t, 5*time.Second, 10*time.Millisecond, "both caches to be fresh", func() bool { return !c1.Stale(iface) && !c2.Stale(iface) })
}

// TestCacheRefusesEmptyPush: when every provider node goes, a cache over
// the zookeeper:// registry keeps the last providers and marks them
// suspect (registry.ProtectEmpty, the default); the next non-empty set
// replaces them. A cache configured with registry.AllowEmpty empties.
// An override that disables every provider empties the set too, and is
// refused alike.
func TestCacheRefusesEmptyPush(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	a := writeNode(t, conn, iface, categoryProviders, "dubbo://10.0.0.1:20880/"+iface+"?interface="+iface, gozk.FlagEphemeral)
	b := writeNode(t, conn, iface, categoryProviders, "dubbo://10.0.0.2:20880/"+iface+"?interface="+iface, gozk.FlagEphemeral)
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	protect := registry.NewCache(r, cacheConfig(t, ""))
	defer protect.Close()
	allowCfg := cacheConfig(t, "")
	allowCfg.EmptyProtection = registry.AllowEmpty
	allow := registry.NewCache(r, allowCfg)
	defer allow.Close()
	pushedP, pushedA := subscribe(t, protect, iface), subscribe(t, allow, iface)
	pushedP(5*time.Second, "both providers", "10.0.0.1:20880", "10.0.0.2:20880")
	pushedA(5*time.Second, "both providers", "10.0.0.1:20880", "10.0.0.2:20880")

	// Both at once, as when a registry wrongly reports none: the last
	// non-empty set is both.
	if _, err := conn.Multi(&gozk.DeleteRequest{Path: a, Version: -1}, &gozk.DeleteRequest{Path: b, Version: -1}); err != nil {
		t.Fatal(err)
	}
	// The AllowEmpty cache, watching the same node, shows the empty
	// push arrived; the default cache marks its set suspect instead.
	pushedA(5*time.Second, "AllowEmpty: the empty set")
	wait.Until(t, 5*time.Second, 10*time.Millisecond, "the default cache to mark its providers suspect", func() bool { return protect.Suspect(iface) })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if ins, err := protect.Instances(ctx, iface); err != nil || !sameAddrs(addrs(ins), []string{"10.0.0.1:20880", "10.0.0.2:20880"}) {
		t.Fatalf("Instances after the empty push = %v, %v; want the last non-empty set", addrs(ins), err)
	}
	if protect.Stale(iface) {
		t.Error("Stale = true: ZooKeeper is up, the set is suspect, not stale")
	}

	writeNode(t, conn, iface, categoryProviders, "dubbo://10.0.0.3:20880/"+iface+"?interface="+iface, gozk.FlagEphemeral)
	pushedP(5*time.Second, "a provider again", "10.0.0.3:20880")
	pushedA(5*time.Second, "a provider again", "10.0.0.3:20880")
	if protect.Suspect(iface) {
		t.Error("Suspect = true after a non-empty set")
	}

	// Dubbo Admin disables the only provider: the set is empty again.
	writeOverride(t, conn, iface, "override://10.0.0.3:20880/"+iface+"?category=configurators&disabled=true&dynamic=false&enabled=true")
	pushedA(5*time.Second, "AllowEmpty: the only provider disabled")
	wait.Until(t, 5*time.Second, 10*time.Millisecond, "the default cache to keep the disabled provider as suspect", func() bool { return protect.Suspect(iface) })
	if ins, err := protect.Instances(ctx, iface); err != nil || !sameAddrs(addrs(ins), []string{"10.0.0.3:20880"}) {
		t.Fatalf("Instances with every provider disabled = %v, %v; want the last non-empty set", addrs(ins), err)
	}
}

// silentServer accepts TCP connections and never answers, as a ZooKeeper
// server that is starting or hung; it returns its address.
func silentServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestSilentServerDoesNotStallReader: with a silent server and a live one
// in the URL, the reader has a session promptly whichever the client
// tries first: the handshake is bounded by the session timeout shared
// among the servers, 1 s each here. The client library alone waits ten
// times two thirds of the session timeout. Eight registries, since each
// client shuffles the servers: all eight trying the live one first has a
// chance of 1 in 256.
func TestSilentServerDoesNotStallReader(t *testing.T) {
	rawURL := "zookeeper://" + silentServer(t) + "?backup=" + zktest.Shared(t).Addr() + "&session=2000&timeout=5000"
	var wg sync.WaitGroup
	for i := range 8 {
		r := newTestRegistry(t, rawURL)
		wg.Go(func() {
			// A Watch whose first read a lost connection ends fails, as
			// zk://'s does (a Cache watches again): the bound is on the
			// time to a watch, not on one call.
			ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
			defer cancel()
			start := time.Now()
			for {
				w, err := r.Watch(ctx, "com.example.Silent")
				if err == nil {
					w.Stop()
					return
				}
				if ctx.Err() != nil {
					t.Errorf("registry %d: no watch within %v with a silent server in the list: %v", i, time.Since(start), err)
					return
				}
				t.Logf("registry %d: Watch after %v: %v; again", i, time.Since(start), err)
			}
		})
	}
	wg.Wait()
}

// TestCloseCutsStuckHandshake: Close does not wait for a handshake with a
// silent server to time out.
func TestCloseCutsStuckHandshake(t *testing.T) {
	r := newTestRegistry(t, "zookeeper://"+silentServer(t)+"?session=20000&timeout=300")
	if _, err := r.Watch(context.Background(), "com.example.Silent"); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Watch against a silent server = %v, want ErrUnavailable", err)
	}
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Fatalf("Close took %v while a handshake was stuck", took)
	}
}

// TestOutageFollowsGrantedSessionTimeout: ZooKeeper grants a session
// timeout between 2 and 20 ticks whatever the client asks for; a watcher
// cut off from it reports the outage once the session has been down for
// the timeout granted, when ZooKeeper has expired it, not the one asked
// for.
func TestOutageFollowsGrantedSessionTimeout(t *testing.T) {
	srv := zktest.StartWithTick(t, time.Second)
	const ask, granted = 500 * time.Millisecond, 2 * time.Second
	proxy := startCutter(t, srv.Addr())
	r := newTestRegistry(t, "zookeeper://"+proxy.l.Addr().String()+"?session=500&timeout=5000")
	w, err := r.Watch(context.Background(), "com.example.Granted")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	nextSet(t, w, time.Second, "before the cut")
	if got := r.reader.sessionTimeout(); got != granted {
		t.Fatalf("session timeout %v after asking for %v with tickTime 1s; want the %v granted", got, ask, granted)
	}

	cut := time.Now() // before: the client may see the cut first
	proxy.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), granted+3*time.Second)
	defer cancel()
	_, err = w.Next(ctx)
	took := time.Since(cut)
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Next %v after the cut = %v; want the outage reported", took, err)
	}
	if took < granted {
		t.Fatalf("the outage was reported %v after the cut, before the session timeout granted (%v; asked for %v)", took, granted, ask)
	}
	if want := "(" + granted.String() + ")"; !strings.Contains(err.Error(), want) {
		t.Errorf("outage error %q does not name the timeout granted, %v", err, granted)
	}
}
