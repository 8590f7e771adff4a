// Tests of the Registry API, and the helpers every test here uses.

package zk

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/registrytest"
	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(providerEnv) != "" {
		os.Exit(runProvider())
	}
	goleak.VerifyTestMain(zktest.WithShared(m))
}

// testLogger logs to the test's output, which go test shows for failed
// tests (and with -v), at debug level: the client's own messages too.
func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(t.Output(), &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// newRegistry returns a Registry for cfg that is closed when the test ends.
func newRegistry(t *testing.T, cfg Config) *Registry {
	t.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(t)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		if err := r.Close(); err != nil && !errors.Is(err, registry.ErrClosed) {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func shared(t *testing.T) *Registry {
	t.Helper()
	return newRegistry(t, Config{Servers: []string{zktest.Shared(t).Addr()}})
}

// rawConn opens a plain client session to look at the tree, closed (and
// its goroutines finished) when the test ends.
func rawConn(t *testing.T, addr string) *zk.Conn { return zktest.Client(t, addr) }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func serviceFor(t *testing.T) string {
	return strings.NewReplacer("/", ".", " ", "_").Replace(t.Name()) + "." + time.Now().Format("150405.000000")
}

func inst(service, id string) registry.Instance {
	return registry.Instance{Service: service, ID: id, Addr: "127.0.0.1:" + id}
}

// waitSet calls Next until it returns want, within d, and returns how long
// that took.
func waitSet(t *testing.T, w registry.Watcher, d time.Duration, step string, want ...registry.Instance) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last []registry.Instance
	for {
		got, err := w.Next(ctx)
		if err != nil {
			t.Fatalf("%s: watcher did not reach %v within %v (last: %v): %v", step, want, d, last, err)
		}
		if registry.EqualSets(got, want) {
			return time.Since(start)
		}
		last = got
	}
}

// deadAddr returns a 127.0.0.1 address nothing listens on.
func deadAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func TestConformance(t *testing.T) {
	addr := zktest.Shared(t).Addr()
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		r, err := New(Config{Servers: []string{addr}, Logger: testLogger(t)})
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}

// TestLayout checks the tree with a plain client: a persistent service
// node, an ephemeral instance node of the owner's session holding the
// instance as JSON.
func TestLayout(t *testing.T) {
	srv := zktest.Shared(t)
	r := newRegistry(t, Config{Servers: []string{srv.Addr()}, Prefix: "/layout-test/services"})
	svc := serviceFor(t)
	in := registry.Instance{Service: svc, ID: "10.0.0.7:20880", Addr: "10.0.0.7:20880", Weight: 50,
		Metadata: map[string]string{"version": "1.2.0"}}
	if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, srv.Addr())

	p := "/layout-test/services/" + svc + "/10.0.0.7:20880"
	if got := r.NodePath(svc, in.ID); got != p {
		t.Fatalf("NodePath = %q, want %q", got, p)
	}
	data, stat, err := raw.Get(p)
	if err != nil {
		t.Fatalf("Get %s: %v", p, err)
	}
	if stat.EphemeralOwner == 0 || stat.EphemeralOwner != r.sess.conn.SessionID() {
		t.Fatalf("%s: ephemeralOwner = %#x, want the registry's session %#x", p, stat.EphemeralOwner, r.sess.conn.SessionID())
	}
	var got registry.Instance
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("%s holds %q: %v", p, data, err)
	}
	if !registry.EqualSets([]registry.Instance{got}, []registry.Instance{in}) {
		t.Fatalf("%s holds %+v, want %+v", p, got, in)
	}
	for _, parent := range []string{"/layout-test/services/" + svc, "/layout-test/services"} {
		_, stat, err := raw.Get(parent)
		if err != nil {
			t.Fatalf("Get %s: %v", parent, err)
		}
		if stat.EphemeralOwner != 0 {
			t.Fatalf("%s is ephemeral (owner %#x), want persistent", parent, stat.EphemeralOwner)
		}
	}

	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := raw.Exists(p); err != nil || ok {
		t.Fatalf("after Close: Exists(%s) = %v, %v; want false", p, ok, err)
	}
	if ok, _, err := raw.Exists("/layout-test/services/" + svc); err != nil || !ok {
		t.Fatalf("after Close: the service node is gone (%v, %v); want it kept", ok, err)
	}
}

// TestLayoutWithZooKeeperShell looks at the tree with ZooKeeper's own
// shell, zkCli.sh, on a fresh server. Run with -v to see its output.
func TestLayoutWithZooKeeperShell(t *testing.T) {
	if _, err := zktest.CLIPath(); err != nil {
		t.Skip(err)
	}
	srv := zktest.Start(t)
	r := newRegistry(t, Config{Servers: []string{srv.Addr()}})
	instances := []registry.Instance{
		{Service: "inventory.Inventory", ID: "10.0.0.7:20880", Addr: "10.0.0.7:20880", Weight: 100,
			Metadata: map[string]string{"version": "1.2.0", "zone": "eu-1"}},
		{Service: "inventory.Inventory", ID: "10.0.0.8:20880", Addr: "10.0.0.8:20880"},
		{Service: "greeter.Greeter", ID: "10.0.0.9:20880", Addr: "10.0.0.9:20880"},
	}
	for _, in := range instances {
		if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cli := func(args ...string) []string {
		t.Helper()
		out, err := srv.CLI(ctx, args...)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("$ zkCli.sh -server %s %s\n%s", srv.Addr(), strings.Join(args, " "), out)
		return strings.Split(out, "\n")
	}
	has := func(lines []string, want string) bool {
		for _, l := range lines {
			if strings.TrimSpace(l) == want {
				return true
			}
		}
		return false
	}

	ls := cli("ls", "-R", "/services")
	for _, want := range []string{
		"/services",
		"/services/greeter.Greeter",
		"/services/inventory.Inventory",
		"/services/greeter.Greeter/10.0.0.9:20880",
		"/services/inventory.Inventory/10.0.0.7:20880",
		"/services/inventory.Inventory/10.0.0.8:20880",
	} {
		if !has(ls, want) {
			t.Errorf("ls -R /services lacks %q", want)
		}
	}

	in := instances[0]
	p := "/services/" + in.Service + "/" + in.ID
	data, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	if get := cli("get", p); !has(get, string(data)) {
		t.Errorf("get %s lacks the instance as JSON, %s", p, data)
	}
	owner := fmt.Sprintf("ephemeralOwner = 0x%x", r.sess.conn.SessionID())
	if stat := cli("stat", p); !has(stat, owner) {
		t.Errorf("stat %s lacks %q", p, owner)
	}
	if stat := cli("stat", "/services/"+in.Service); !has(stat, "ephemeralOwner = 0x0") {
		t.Errorf("stat /services/%s: the service node is not persistent", in.Service)
	}
}

func TestNewDoesNoIOAndValidates(t *testing.T) {
	r, err := New(Config{Servers: []string{deadAddr(t)}})
	if err != nil {
		t.Fatal(err)
	}
	if r.sess.conn != nil || r.sess.dialing != nil {
		t.Fatal("New connected")
	}
	cfg := r.Config()
	if cfg.Prefix != "/services" || cfg.SessionTimeout != DefaultSessionTimeout || cfg.RequestTimeout != DefaultRequestTimeout || cfg.Logger == nil {
		t.Fatalf("defaults not filled: %+v", cfg)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("Close of an unused registry: %v", err)
	}
	if err := r.Close(); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("second Close = %v, want ErrClosed", err)
	}

	bad := []struct {
		name string
		cfg  Config
	}{
		{"NoServers", Config{}},
		{"EmptyServer", Config{Servers: []string{"127.0.0.1:2181", " "}}},
		{"NegativeSession", Config{Servers: []string{"h:1"}, SessionTimeout: -time.Second}},
		{"NegativeRequest", Config{Servers: []string{"h:1"}, RequestTimeout: -time.Second}},
		{"ReservedPrefix", Config{Servers: []string{"h:1"}, Prefix: "/zookeeper/x"}},
		{"BadCharInPrefix", Config{Servers: []string{"h:1"}, Prefix: "/a\u0085b"}},
	}
	for _, tt := range bad {
		t.Run(tt.name, func(t *testing.T) {
			if r, err := New(tt.cfg); err == nil {
				r.Close()
				t.Fatalf("New(%+v) succeeded", tt.cfg)
			}
		})
	}
}

// TestBadConfigIsInvalid: bad configurations and URLs wrap
// registry.ErrInvalid.
func TestBadConfigIsInvalid(t *testing.T) {
	for _, u := range []string{
		"zk://h1:2181/services?sessiontimeout=1s",
		"zk://h1:2181/services?session_timeout=soon",
		"zk:///services",
		"zk://h1:2181/zookeeper",
	} {
		_, err := registry.Open(context.Background(), u)
		if err == nil || !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("Open(%q) = %v, want an error wrapping registry.ErrInvalid", u, err)
		}
	}
	if _, err := New(Config{}); err == nil || !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("New(Config{}) = %v, want an error wrapping registry.ErrInvalid", err)
	}
}
