package dubbo

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
	gozk "github.com/go-zookeeper/zk"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newTestRegistry opens a Registry by URL, closed when the test ends.
func newTestRegistry(t *testing.T, rawURL string) *Registry {
	t.Helper()
	r, err := registry.Open(context.Background(), rawURL, registry.WithLogger(testLogger(t)))
	if err != nil {
		t.Fatalf("Open(%s): %v", rawURL, err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil && !errors.Is(err, registry.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return r.(*Registry)
}

// rawConn opens a plain client session to look at the tree and to write
// nodes as a Java provider would, closed when the test ends.
func rawConn(t *testing.T, addr string) *gozk.Conn { return zktest.Client(t, addr) }

// ifaceFor returns a Java interface name of the test's own.
func ifaceFor(t *testing.T) string {
	return "com.example." + strings.NewReplacer("/", "_", " ", "_").Replace(t.Name()) + strconv.FormatInt(time.Now().UnixNano(), 36)
}

func export(iface, addr string, md map[string]string) registry.Instance {
	m := map[string]string{MetaMethods: "stock,deduct"}
	for k, v := range md {
		m[k] = v
	}
	return registry.Instance{Service: iface, ID: addr, Addr: addr, Metadata: m}
}

// children lists a node's children, failing the test on error.
func children(t *testing.T, conn *gozk.Conn, p string) []string {
	t.Helper()
	got, _, err := conn.Children(p)
	if err != nil {
		t.Fatalf("children of %s: %v", p, err)
	}
	return got
}

// waitChildren waits, up to d, until p has n children.
func waitChildren(t *testing.T, conn *gozk.Conn, p string, n int, d time.Duration, step string) []string {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		got, _, events, err := conn.ChildrenW(p)
		if errors.Is(err, gozk.ErrNoNode) && n == 0 {
			return nil
		}
		if err != nil {
			t.Fatalf("%s: children of %s: %v", step, p, err)
		}
		if len(got) == n {
			return got
		}
		select {
		case <-events:
		case <-time.After(time.Until(deadline)):
			t.Fatalf("%s: %s has %d children after %v, want %d: %v", step, p, len(got), d, n, got)
		}
	}
}

func TestRegisterWritesJavaProviderNode(t *testing.T) {
	zs := zktest.Shared(t)
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	in := export(iface, "127.0.0.1:20880", map[string]string{
		MetaVersion: "1.0.0", MetaGroup: "g1", MetaApplication: "inventory",
		MetaMethods: "stock, deduct,stock,deductOnce",
	})
	in.Weight = 30
	before := time.Now().UnixMilli()
	if err := r.Register(context.Background(), in); err != nil {
		t.Fatal(err)
	}
	providers := "/dubbo/" + iface + "/providers"
	nodes := children(t, conn, providers)
	if len(nodes) != 1 {
		t.Fatalf("%s holds %v, want one node", providers, nodes)
	}
	if p, ok := r.ProviderPath(in); !ok || p != providers+"/"+nodes[0] {
		t.Errorf("ProviderPath = %q, %v; want %q", p, ok, providers+"/"+nodes[0])
	}
	raw, err := zkDecode(nodes[0])
	if err != nil {
		t.Fatal(err)
	}
	if zkEncode(raw) != nodes[0] {
		t.Errorf("node name %q is not URLEncoder's form of %q", nodes[0], raw)
	}
	u, err := parseProviderURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.protocol != "dubbo" || u.addr != "127.0.0.1:20880" || u.path != iface {
		t.Errorf("URL %s: want dubbo://127.0.0.1:20880/%s", raw, iface)
	}
	ts, err := strconv.ParseInt(u.params["timestamp"], 10, 64)
	if err != nil || ts < before || ts > time.Now().UnixMilli() {
		t.Errorf("timestamp=%q, want the registration's time in ms", u.params["timestamp"])
	}
	delete(u.params, "timestamp")
	want := map[string]string{
		"anyhost": "false", "application": "inventory", "category": "providers", "deprecated": "false",
		"dubbo": "2.0.2", "dynamic": "true", "generic": "false", "group": "g1", "interface": iface,
		"methods": "deduct,deductOnce,stock", "pid": strconv.Itoa(os.Getpid()), "release": Release,
		"serialization": "hessian2", "side": "provider", "version": "1.0.0", "weight": "30",
	}
	for k, v := range want {
		if u.params[k] != v {
			t.Errorf("parameter %s=%q, want %q", k, u.params[k], v)
		}
	}
	for k := range u.params {
		if _, ok := want[k]; !ok {
			t.Errorf("unexpected parameter %s=%q", k, u.params[k])
		}
	}
	// The provider node is ephemeral, its parents persistent, as Java
	// creates them.
	for p, ephemeral := range map[string]bool{"/dubbo": false, "/dubbo/" + iface: false, providers: false, providers + "/" + nodes[0]: true} {
		_, st, err := conn.Get(p)
		if err != nil {
			t.Fatalf("get %s: %v", p, err)
		}
		if (st.EphemeralOwner != 0) != ephemeral {
			t.Errorf("%s: ephemeral owner %x, want ephemeral=%v", p, st.EphemeralOwner, ephemeral)
		}
	}
}

func TestRegisterDefaults(t *testing.T) {
	zs := zktest.Shared(t)
	r := newTestRegistry(t, "zookeeper://"+zs.Addr()+"?group=estate")
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	if err := r.Register(context.Background(), export(iface, "127.0.0.1:20881", nil)); err != nil {
		t.Fatal(err)
	}
	nodes := children(t, conn, "/estate/"+iface+"/providers")
	if len(nodes) != 1 {
		t.Fatalf("want one node under /estate, got %v", nodes)
	}
	raw, _ := zkDecode(nodes[0])
	u, err := parseProviderURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	if u.params["weight"] != "100" || u.params["application"] != filepath.Base(os.Args[0]) {
		t.Errorf("weight=%q application=%q: want 100 and the program's name", u.params["weight"], u.params["application"])
	}
	for _, k := range []string{"version", "group"} {
		if v, ok := u.params[k]; ok {
			t.Errorf("parameter %s=%q written though not set", k, v)
		}
	}
}

func TestRegisterWithoutMethodsWritesNothing(t *testing.T) {
	zs := zktest.Shared(t)
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	conn := rawConn(t, zs.Addr())
	svc := ifaceFor(t)
	in := registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:20880"}
	if err := r.Register(context.Background(), in); err != nil {
		t.Fatalf("Register of a dabb-native instance: %v, want nil", err)
	}
	if ok, _, err := conn.Exists("/dubbo/" + svc); err != nil || ok {
		t.Errorf("/dubbo/%s exists=%v (%v): want nothing written", svc, ok, err)
	}
	if err := r.Deregister(context.Background(), in); err != nil {
		t.Errorf("Deregister of an instance never published: %v, want nil", err)
	}
}

func TestRegisterRefusesBadExports(t *testing.T) {
	r := newTestRegistry(t, "zookeeper://127.0.0.1:1")
	for name, in := range map[string]registry.Instance{
		"unspecified address": export("com.x.G", "0.0.0.0:20880", nil),
		"no port":             export("com.x.G", "127.0.0.1", nil),
		"not an interface":    export("com.x G", "127.0.0.1:20880", nil),
		"empty method":        export("com.x.G", "127.0.0.1:20880", map[string]string{MetaMethods: "a,,b"}),
		"group with '&'":      export("com.x.G", "127.0.0.1:20880", map[string]string{MetaGroup: "a&b"}),
	} {
		// Refused before any I/O: the registry's server does not exist.
		if err := r.Register(context.Background(), in); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("%s: Register = %v, want ErrInvalid", name, err)
		}
	}
}

func TestReRegisterReplacesNode(t *testing.T) {
	zs := zktest.Shared(t)
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	providers := "/dubbo/" + iface + "/providers"
	in := export(iface, "127.0.0.1:20880", nil)
	ctx := context.Background()
	if err := r.Register(ctx, in); err != nil {
		t.Fatal(err)
	}
	first := children(t, conn, providers)
	// The same export again: the node stays, timestamp included.
	if err := r.Register(ctx, in); err != nil {
		t.Fatal(err)
	}
	if again := children(t, conn, providers); len(again) != 1 || again[0] != first[0] {
		t.Errorf("after the same Register: %v, want %v", again, first)
	}
	in.Weight = 5
	if err := r.Register(ctx, in); err != nil {
		t.Fatal(err)
	}
	now := children(t, conn, providers)
	if len(now) != 1 || now[0] == first[0] || !strings.Contains(now[0], "weight%3D5") {
		t.Errorf("after a new weight: %v, want one node with weight=5", now)
	}
	if err := r.Deregister(ctx, in); err != nil {
		t.Fatal(err)
	}
	if left := children(t, conn, providers); len(left) != 0 {
		t.Errorf("after Deregister: %v, want none", left)
	}
}

func TestCloseRemovesProviderNode(t *testing.T) {
	zs := zktest.Shared(t)
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	if err := r.Register(context.Background(), export(iface, "127.0.0.1:20880", nil)); err != nil {
		t.Fatal(err)
	}
	providers := "/dubbo/" + iface + "/providers"
	if n := children(t, conn, providers); len(n) != 1 {
		t.Fatalf("before Close: %v", n)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	// Close deletes the node itself, before the session ends.
	if n := children(t, conn, providers); len(n) != 0 {
		t.Errorf("after Close: %v, want none", n)
	}
	if err := r.Register(context.Background(), export(iface, "127.0.0.1:20880", nil)); !errors.Is(err, registry.ErrClosed) {
		t.Errorf("Register after Close = %v, want ErrClosed", err)
	}
}

// The provider nodes of several interfaces share one session: a process
// that exports many interfaces holds one ZooKeeper connection to publish,
// as Java's registry does.
func TestInterfacesShareOneSession(t *testing.T) {
	zs := zktest.Shared(t)
	r := newTestRegistry(t, "zookeeper://"+zs.Addr())
	conn := rawConn(t, zs.Addr())
	owners := map[int64][]string{}
	for i := range 3 {
		iface := ifaceFor(t) + strconv.Itoa(i)
		if err := r.Register(context.Background(), export(iface, "127.0.0.1:20880", nil)); err != nil {
			t.Fatal(err)
		}
		node, ok := r.ProviderPath(export(iface, "127.0.0.1:20880", nil))
		if !ok {
			t.Fatalf("no provider path for %s", iface)
		}
		_, stat, err := conn.Get(node)
		if err != nil {
			t.Fatalf("Get %s: %v", node, err)
		}
		owners[stat.EphemeralOwner] = append(owners[stat.EphemeralOwner], iface)
	}
	if len(owners) != 1 {
		t.Errorf("the provider nodes belong to %d sessions (%v); want one", len(owners), owners)
	}
	if _, ok := owners[0]; ok {
		t.Errorf("a provider node is persistent: %v", owners[0])
	}
}

// cutter forwards TCP connections to a server until Cut: a partition
// between one client and ZooKeeper.
type cutter struct {
	l      net.Listener
	target string
	wg     sync.WaitGroup

	mu    sync.Mutex // guards following
	cut   bool
	conns map[net.Conn]struct{}
}

func startCutter(t *testing.T, target string) *cutter {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{l: l, target: target, conns: make(map[net.Conn]struct{})}
	c.wg.Go(c.accept)
	t.Cleanup(func() {
		l.Close()
		c.Cut()
		c.wg.Wait()
	})
	return c
}

func (c *cutter) accept() {
	for {
		in, err := c.l.Accept()
		if err != nil {
			return
		}
		c.mu.Lock()
		if c.cut {
			c.mu.Unlock()
			in.Close()
			continue
		}
		c.mu.Unlock()
		out, err := net.Dial("tcp", c.target)
		if err != nil {
			in.Close()
			continue
		}
		c.mu.Lock()
		c.conns[in], c.conns[out] = struct{}{}, struct{}{}
		c.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			dst.Close()
			src.Close()
		}
		c.wg.Go(func() { pipe(in, out) })
		c.wg.Go(func() { pipe(out, in) })
	}
}

// Cut closes every forwarded connection and refuses new ones.
func (c *cutter) Cut() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	for conn := range c.conns {
		conn.Close()
	}
	clear(c.conns)
}

// Restore accepts connections again.
func (c *cutter) Restore() {
	c.mu.Lock()
	c.cut = false
	c.mu.Unlock()
}

func TestReRegisteredAfterSessionExpiry(t *testing.T) {
	zs := zktest.Shared(t)
	proxy := startCutter(t, zs.Addr())
	// ZooKeeper grants 400 ms to 60 s here (zktest's ticks of 200 ms).
	const session = 1200 * time.Millisecond
	r := newTestRegistry(t, "zookeeper://"+proxy.l.Addr().String()+"?session="+strconv.Itoa(int(session/time.Millisecond)))
	conn := rawConn(t, zs.Addr())
	iface := ifaceFor(t)
	if err := r.Register(context.Background(), export(iface, "127.0.0.1:20880", nil)); err != nil {
		t.Fatal(err)
	}
	providers := "/dubbo/" + iface + "/providers"
	before := waitChildren(t, conn, providers, 1, time.Second, "registered")
	_, st, err := conn.Get(providers + "/" + before[0])
	if err != nil {
		t.Fatal(err)
	}
	proxy.Cut()
	// ZooKeeper expires the cut-off session and deletes its node.
	waitChildren(t, conn, providers, 0, session+3*time.Second, "session expired")
	proxy.Restore()
	after := waitChildren(t, conn, providers, 1, 10*time.Second, "re-registered on a new session")
	if after[0] != before[0] {
		t.Errorf("re-registered as %q, want the same node %q", after[0], before[0])
	}
	_, st2, err := conn.Get(providers + "/" + after[0])
	if err != nil {
		t.Fatal(err)
	}
	if st2.EphemeralOwner == st.EphemeralOwner || st2.EphemeralOwner == 0 {
		t.Errorf("owner %x after expiry, was %x: want a new session's ephemeral node", st2.EphemeralOwner, st.EphemeralOwner)
	}
}
