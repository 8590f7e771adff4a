package dubbo

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

// writeJavaProvider creates a provider node as Java's ZookeeperRegistry
// does: persistent parents, an ephemeral node named by the encoded URL,
// holding the host's address as Curator's default data. It returns the
// node's name.
func writeJavaProvider(t *testing.T, conn *gozk.Conn, iface, rawURL string) string {
	t.Helper()
	return path.Base(writeNode(t, conn, iface, categoryProviders, rawURL, gozk.FlagEphemeral))
}

// writeNode creates the node of rawURL under {iface}/{category} with
// flags, its parents persistent, and returns its path.
func writeNode(t *testing.T, conn *gozk.Conn, iface, category, rawURL string, flags int32) string {
	t.Helper()
	acl := gozk.WorldACL(gozk.PermAll)
	p := ""
	for _, part := range []string{"dubbo", iface, category} {
		p += "/" + part
		if _, err := conn.Create(p, nil, 0, acl); err != nil && !errors.Is(err, gozk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	p += "/" + zkEncode(rawURL)
	if _, err := conn.Create(p, []byte("127.0.0.1"), flags, acl); err != nil {
		t.Fatalf("create %s: %v", rawURL, err)
	}
	return p
}

// addrs returns the addresses of a set, in its order.
func addrs(set []registry.Instance) []string {
	out := make([]string, len(set))
	for i, in := range set {
		out[i] = in.Addr
	}
	return out
}

// nextSet calls Next within d until the set has the addresses want (in
// ID order, as Next sorts), and returns it.
func nextSet(t *testing.T, w registry.Watcher, d time.Duration, step string, want ...string) []registry.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last []registry.Instance
	for {
		got, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("%s: no set with %v within %v (last %v): %v", step, want, d, addrs(last), err)
		}
		if sameAddrs(addrs(got), want) {
			return got
		}
		last = got
	}
}

func sameAddrs(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	seen := make(map[string]int)
	for _, x := range a {
		seen[x]++
	}
	for _, x := range b {
		seen[x]--
	}
	for _, n := range seen {
		if n != 0 {
			return false
		}
	}
	return true
}

func TestWatchFiltersAsJavaConsumers(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	base := "://10.0.0.%d:20880/" + iface + "?application=java-app&interface=" + iface + "&side=provider"
	url := func(proto string, n int, extra string) string {
		return proto + fmt.Sprintf(base, n) + extra
	}
	plain := writeJavaProvider(t, conn, iface, url("dubbo", 1, "&weight=50"))
	writeJavaProvider(t, conn, iface, url("dubbo", 2, "&group=g1&version=1.0"))
	writeJavaProvider(t, conn, iface, url("dubbo", 3, "&group=g1&version=2.0"))
	writeJavaProvider(t, conn, iface, url("dubbo", 4, "&enabled=false"))
	writeJavaProvider(t, conn, iface, url("dubbo", 5, "&category=configurators"))
	writeJavaProvider(t, conn, iface, url("rest", 6, ""))
	if _, err := conn.Create("/dubbo/"+iface+"/providers/not-a-url", nil, gozk.FlagEphemeral, gozk.WorldACL(gozk.PermAll)); err != nil {
		t.Fatal(err)
	}

	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	for key, want := range map[string][]string{
		iface:                  {"10.0.0.1:20880"},
		"g1/" + iface + ":1.0": {"10.0.0.2:20880"},
		"g1/" + iface + ":*":   {"10.0.0.2:20880", "10.0.0.3:20880"},
		"*/" + iface + ":*":    {"10.0.0.1:20880", "10.0.0.2:20880", "10.0.0.3:20880"},
		"g2/" + iface + ":1.0": {},
		iface + ":1.0":         {},
	} {
		w, err := r.Watch(context.Background(), key)
		if err != nil {
			t.Fatalf("Watch(%s): %v", key, err)
		}
		got, err := w.Next(context.Background())
		w.Stop()
		if err != nil {
			t.Fatalf("Next(%s): %v", key, err)
		}
		if !sameAddrs(addrs(got), want) {
			t.Errorf("key %s: providers %v, want %v", key, addrs(got), want)
		}
		for _, in := range got {
			if in.Service != key {
				t.Errorf("key %s: instance of service %q", key, in.Service)
			}
		}
	}

	w, err := r.Watch(context.Background(), iface)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	got, err := w.Next(context.Background())
	if err != nil || len(got) != 1 {
		t.Fatalf("Next: %v, %v", got, err)
	}
	in := got[0]
	if in.ID != plain || in.Weight != 50 {
		t.Errorf("instance ID %q weight %d, want the node's name and 50", in.ID, in.Weight)
	}
	if in.Metadata["application"] != "java-app" || in.Metadata["side"] != "provider" || in.Metadata["interface"] != iface {
		t.Errorf("metadata %v: want the URL's parameters", in.Metadata)
	}
}

func TestWatchFollowsProviders(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	consumer := newTestRegistry(t, "zookeeper://"+zs.Addr())
	// Nothing under /dubbo/{iface} yet: an empty set, and a watch on the
	// node's creation.
	w, err := consumer.Watch(context.Background(), iface+":1.0")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	nextSet(t, w, time.Second, "nothing yet")

	java := writeJavaProvider(t, conn, iface, "dubbo://10.0.0.9:20880/"+iface+"?interface="+iface+"&version=1.0")
	nextSet(t, w, 5*time.Second, "a Java provider", "10.0.0.9:20880")

	// dabb's own export, published by another Registry, read back.
	provider := newTestRegistry(t, "zookeeper://"+zs.Addr())
	in := export(iface, "127.0.0.1:20880", map[string]string{MetaVersion: "1.0", MetaApplication: "inventory"})
	in.Weight = 7
	if err := provider.Register(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	set := nextSet(t, w, 5*time.Second, "dabb's export", "10.0.0.9:20880", "127.0.0.1:20880")
	for _, got := range set {
		if got.Addr != in.Addr {
			continue
		}
		if got.Weight != 7 || got.Metadata["methods"] != "deduct,stock" || got.Metadata["application"] != "inventory" {
			t.Errorf("dabb's export read back as %+v", got)
		}
	}

	if err := conn.Delete("/dubbo/"+iface+"/providers/"+java, -1); err != nil {
		t.Fatal(err)
	}
	nextSet(t, w, 5*time.Second, "the Java provider gone", "127.0.0.1:20880")
	if err := provider.Close(); err != nil {
		t.Fatal(err)
	}
	nextSet(t, w, 5*time.Second, "dabb's provider closed")
}

func TestCacheOverDubboLayout(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	writeJavaProvider(t, conn, iface, "dubbo://10.0.0.7:20880/"+iface+"?interface="+iface+"&version=2.1")
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	// A busy machine may take longer than the default 500 ms to open
	// the first session.
	c := registry.NewCache(r, registry.CacheConfig{Logger: testLogger(t), InitialTimeout: 5 * time.Second})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := c.Instances(ctx, iface+":2.1")
	if err != nil {
		t.Fatal(err)
	}
	if !sameAddrs(addrs(got), []string{"10.0.0.7:20880"}) {
		t.Errorf("cache: %v", addrs(got))
	}
}

func TestWatchReportsOutageAndResumes(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	writeJavaProvider(t, conn, iface, "dubbo://10.0.0.8:20880/"+iface+"?interface="+iface)
	proxy := startCutter(t, zs.Addr())
	const session = 1200 * time.Millisecond
	r := newTestRegistry(t, "zookeeper://"+proxy.l.Addr().String()+"?session="+strconv.Itoa(int(session/time.Millisecond)))
	w, err := r.Watch(context.Background(), iface)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	nextSet(t, w, time.Second, "before the cut", "10.0.0.8:20880")

	before := r.reader.conn.SessionID()

	proxy.Cut()
	ctx, cancel := context.WithTimeout(context.Background(), session+3*time.Second)
	defer cancel()
	start := time.Now()
	if _, err := w.Next(ctx); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Next during the cut = %v, want ErrUnavailable", err)
	}
	if took := time.Since(start); took < session/2 {
		t.Errorf("outage reported after %v, before the session timeout %v", took, session)
	}
	// A provider that arrives during the outage is seen once the
	// session is back.
	writeJavaProvider(t, conn, iface, "dubbo://10.0.0.9:20880/"+iface+"?interface="+iface)
	proxy.Restore()
	nextSet(t, w, 10*time.Second, "after the cut", "10.0.0.8:20880", "10.0.0.9:20880")
	expectWatchesArmed(t, conn, w, iface, before, "after the cut", "10.0.0.8:20880", "10.0.0.9:20880")
}

// expectWatchesArmed checks that w's watches are set on ZooKeeper after
// a session loss: the reader has a session other than before (a new one
// after an expiry, the same one when before is 0), and a provider added
// and an override written now, with no outage to trigger a read, both
// reach w. have are the providers w holds.
func expectWatchesArmed(t *testing.T, conn *gozk.Conn, w registry.Watcher, iface string, before int64, step string, have ...string) {
	t.Helper()
	rd := w.(*watcher).rd
	if after := rd.conn.SessionID(); before != 0 && after == before {
		t.Fatalf("%s: session %x, the one before: want a new session after the expiry", step, after)
	}
	writeJavaProvider(t, conn, iface, "dubbo://10.0.0.10:20880/"+iface+"?interface="+iface)
	nextSet(t, w, 5*time.Second, step+": the providers watch re-armed", append(slices.Clone(have), "10.0.0.10:20880")...)
	writeOverride(t, conn, iface, "override://10.0.0.10:20880/"+iface+"?category=configurators&disabled=true&dynamic=false&enabled=true")
	nextSet(t, w, 5*time.Second, step+": the configurators watch re-armed", have...)
}

// TestWatchReArmsAfterReconnect: a connection lost for less than the
// session timeout keeps the session; the watches the client restores
// report changes made after it is back.
func TestWatchReArmsAfterReconnect(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	writeJavaProvider(t, conn, iface, "dubbo://10.0.0.8:20880/"+iface+"?interface="+iface)
	proxy := startCutter(t, zs.Addr())
	r := newTestRegistry(t, "zookeeper://"+proxy.l.Addr().String()+"?session=10000")
	w, err := r.Watch(context.Background(), iface)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	nextSet(t, w, time.Second, "before the cut", "10.0.0.8:20880")
	session := r.reader.conn.SessionID()
	r.reader.mu.Lock()
	state := r.reader.stateCh // closed at the next session event
	r.reader.mu.Unlock()

	proxy.Cut()
	select {
	case <-state:
	case <-time.After(5 * time.Second):
		t.Fatal("the reader saw no session event within 5s of the cut")
	}
	proxy.Restore()
	if err := r.reader.waitSession(ctxWithin(t, 10*time.Second)); err != nil {
		t.Fatalf("no session after the cut was restored: %v", err)
	}
	if got := r.reader.conn.SessionID(); got != session {
		t.Fatalf("session %x after a short cut, want the same session %x", got, session)
	}
	expectWatchesArmed(t, conn, w, iface, 0, "after a short cut", "10.0.0.8:20880")
}

func ctxWithin(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func TestWatchRefusesBadKeys(t *testing.T) {
	r := newTestRegistry(t, "zookeeper://127.0.0.1:1")
	for _, key := range []string{"", "g/", "a/b/c"} {
		if _, err := r.Watch(context.Background(), key); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("Watch(%q) = %v, want ErrInvalid", key, err)
		}
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Watch(context.Background(), "com.x.G"); !errors.Is(err, registry.ErrClosed) {
		t.Errorf("Watch after Close = %v, want ErrClosed", err)
	}
}

// writeOverride creates an override URL under configurators, as Dubbo
// Admin does (persistent), and returns its path.
func writeOverride(t *testing.T, conn *gozk.Conn, iface, rawURL string) string {
	t.Helper()
	acl := gozk.WorldACL(gozk.PermAll)
	p := ""
	for _, part := range []string{"dubbo", iface, "configurators"} {
		p += "/" + part
		if _, err := conn.Create(p, nil, 0, acl); err != nil && !errors.Is(err, gozk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	p += "/" + zkEncode(rawURL)
	if _, err := conn.Create(p, nil, 0, acl); err != nil {
		t.Fatalf("create override %s: %v", rawURL, err)
	}
	return p
}

func TestWatchAppliesOverrides(t *testing.T) {
	zs := zktest.Shared(t)
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	writeJavaProvider(t, conn, iface, "dubbo://10.0.0.1:20880/"+iface+"?interface="+iface+"&application=a")
	writeJavaProvider(t, conn, iface, "dubbo://10.0.0.2:20880/"+iface+"?interface="+iface+"&application=a")
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	w, err := r.Watch(context.Background(), iface)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	nextSet(t, w, time.Second, "both", "10.0.0.1:20880", "10.0.0.2:20880")

	// Dubbo Admin's "disable" of one provider.
	disable := writeOverride(t, conn, iface, "override://10.0.0.1:20880/"+iface+"?category=configurators&disabled=true&dynamic=false&enabled=true")
	nextSet(t, w, time.Second, "10.0.0.1 disabled by an override", "10.0.0.2:20880")
	if err := conn.Delete(disable, -1); err != nil {
		t.Fatal(err)
	}
	nextSet(t, w, time.Second, "the override gone", "10.0.0.1:20880", "10.0.0.2:20880")

	// An override of another group, one of another application, one
	// that is not enabled and one for a consumer host (no port) change
	// nothing: they are written before the weight for one provider, so
	// the set with that weight was read with them in place.
	writeOverride(t, conn, iface, "override://0.0.0.0/"+iface+"?category=configurators&group=g9&disabled=true")
	writeOverride(t, conn, iface, "override://0.0.0.0/"+iface+"?category=configurators&application=b&disabled=true")
	writeOverride(t, conn, iface, "override://0.0.0.0/"+iface+"?category=configurators&enabled=false&disabled=true")
	writeOverride(t, conn, iface, "override://10.9.9.9/"+iface+"?category=configurators&disabled=true")
	writeOverride(t, conn, iface, "override://10.0.0.2:20880/"+iface+"?category=configurators&dynamic=false&weight=200")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		set, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("no set with weight 200 for 10.0.0.2: %v", err)
		}
		if len(set) != 2 {
			t.Fatalf("set %v: an override that should not apply did", addrs(set))
		}
		if set[0].Addr == "10.0.0.2:20880" && set[0].Weight == 200 || set[1].Addr == "10.0.0.2:20880" && set[1].Weight == 200 {
			break
		}
	}
	// One for every host disables both.
	writeOverride(t, conn, iface, "override://0.0.0.0/"+iface+"?category=configurators&disabled=true&application=a")
	nextSet(t, w, time.Second, "all disabled")
}
