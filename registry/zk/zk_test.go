package zk

import (
	"context"
	"encoding/json"
	"errors"
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

type quietLogger struct{}

func (quietLogger) Printf(string, ...any) {}

// rawConn opens a plain client session to look at the tree, closed (and
// its goroutines finished) when the test ends.
func rawConn(t *testing.T, addr string) *zk.Conn {
	t.Helper()
	conn, events, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogger(quietLogger{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		for range events {
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-ctx.Done():
			t.Fatalf("raw client: no session with %s (state %v)", addr, conn.State())
		}
	}
	return conn
}

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

func TestConformanceByURL(t *testing.T) {
	addr := zktest.Shared(t).Addr()
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		r, err := registry.Open(context.Background(), "zk://"+addr+"/dabb-url-test/services?session_timeout=4s&request_timeout=2s")
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}

func TestVisibleWithinOneSecond(t *testing.T) {
	provider, consumer := shared(t), shared(t)
	svc := serviceFor(t)
	w, err := consumer.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "empty at first")

	a := inst(svc, "20001")
	if err := provider.Register(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	took := waitSet(t, w, time.Second, "after Register", a)
	t.Logf("registration visible after %v", took)

	if err := provider.Deregister(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	took = waitSet(t, w, time.Second, "after Deregister")
	t.Logf("deregistration visible after %v", took)
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

// TestReplacesNodeOfOldSession: a node left under our instance ID by
// another session (a previous process) is taken over at once.
func TestReplacesNodeOfOldSession(t *testing.T) {
	srv := zktest.Shared(t)
	old, r := shared(t), shared(t)
	svc := serviceFor(t)
	a := inst(svc, "20001")
	if err := old.Register(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	b := a
	b.Metadata = map[string]string{"generation": "2"}
	if err := r.Register(ctxFor(t, 5*time.Second), b); err != nil {
		t.Fatal(err)
	}
	data, stat, err := rawConn(t, srv.Addr()).Get(r.NodePath(svc, a.ID))
	if err != nil {
		t.Fatal(err)
	}
	if stat.EphemeralOwner != r.sess.conn.SessionID() {
		t.Fatalf("ephemeralOwner = %#x, want the new session %#x (old %#x)", stat.EphemeralOwner, r.sess.conn.SessionID(), old.sess.conn.SessionID())
	}
	if !strings.Contains(string(data), `"generation":"2"`) {
		t.Fatalf("node holds %s, want the new instance", data)
	}
	// The old owner's Deregister must not remove the new owner's node.
	if err := old.Deregister(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := rawConn(t, srv.Addr()).Exists(r.NodePath(svc, a.ID)); err != nil || !ok {
		t.Fatalf("the old owner's Deregister removed the new owner's node (%v, %v)", ok, err)
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

// TestZooKeeperDownFailsFast: with no server, every call returns an error
// that says so within RequestTimeout (or the context's deadline, when it
// is earlier), and Close does not hang.
func TestZooKeeperDownFailsFast(t *testing.T) {
	const requestTimeout = 400 * time.Millisecond
	const slack = 1500 * time.Millisecond // scheduling on a loaded machine
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: requestTimeout})
	svc := serviceFor(t)
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Register", func(ctx context.Context) error { return r.Register(ctx, inst(svc, "1")) }},
		{"Deregister", func(ctx context.Context) error { return r.Deregister(ctx, inst(svc, "1")) }},
		{"Watch", func(ctx context.Context) error {
			w, err := r.Watch(ctx, svc)
			if err == nil {
				w.Stop()
			}
			return err
		}},
	}
	ctxs := []struct {
		name  string
		ctx   func() (context.Context, context.CancelFunc)
		bound time.Duration
	}{
		{"Background", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, requestTimeout},
		{"ShortDeadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 100*time.Millisecond)
		}, 100 * time.Millisecond},
	}
	for _, c := range calls {
		for _, cc := range ctxs {
			t.Run(c.name+"/"+cc.name, func(t *testing.T) {
				ctx, cancel := cc.ctx()
				defer cancel()
				start := time.Now()
				err := c.call(ctx)
				took := time.Since(start)
				if err == nil {
					t.Fatal("succeeded with ZooKeeper down")
				}
				if !errors.Is(err, ErrNoSession) || !errors.Is(err, context.DeadlineExceeded) {
					t.Fatalf("err = %v, want ErrNoSession and context.DeadlineExceeded", err)
				}
				if took > cc.bound+slack {
					t.Fatalf("returned after %v, want within %v", took, cc.bound+slack)
				}
			})
		}
	}
	start := time.Now()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("Close took %v with ZooKeeper down", took)
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

func TestInvalidNamesNeverReachZooKeeper(t *testing.T) {
	// A dead address: a call that got past validation would fail with
	// ErrNoSession instead of registry.ErrInvalid.
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: 200 * time.Millisecond})
	tests := []struct {
		name string
		in   registry.Instance
	}{
		{"C1Control", registry.Instance{Service: "svc\u0085", ID: "a", Addr: "127.0.0.1:1"}},
		{"PrivateUse", registry.Instance{Service: "svc", ID: "a\ue000", Addr: "127.0.0.1:1"}},
		{"InvalidUTF8", registry.Instance{Service: "svc\xff", ID: "a", Addr: "127.0.0.1:1"}},
		{"DotID", registry.Instance{Service: "svc", ID: "..", Addr: "127.0.0.1:1"}},
		{"NoAddr", registry.Instance{Service: "svc", ID: "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := r.Register(context.Background(), tt.in)
			if !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("Register(%+v) = %v, want registry.ErrInvalid", tt.in, err)
			}
			if tt.in.Addr == "" {
				return // Deregister needs no address
			}
			if err := r.Deregister(context.Background(), tt.in); !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("Deregister(%+v) = %v, want registry.ErrInvalid", tt.in, err)
			}
			if tt.in.Service == "svc" {
				return // a valid service name
			}
			if _, err := r.Watch(context.Background(), tt.in.Service); !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("Watch(%q) = %v, want registry.ErrInvalid", tt.in.Service, err)
			}
		})
	}
}

// TestCacheRefusedName: a Cache over zk looking up a name that
// registry.ValidateService accepts and ZooKeeper refuses gets an error
// wrapping registry.ErrInvalid at once, not an outage after InitialTimeout.
func TestCacheRefusedName(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: 200 * time.Millisecond})
	const initialTimeout = 2 * time.Second
	c := registry.NewCache(r, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler), InitialTimeout: initialTimeout})
	defer c.Close()
	svc := "svc\u0085" // a C1 control character
	if err := registry.ValidateService(svc); err != nil {
		t.Fatalf("registry.ValidateService(%q) = %v; the test needs a name only zk refuses", svc, err)
	}
	start := time.Now()
	_, err := c.Instances(ctxFor(t, 3*initialTimeout), svc)
	took := time.Since(start)
	if !errors.Is(err, registry.ErrInvalid) || errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Instances(%q) = %v; want an error wrapping registry.ErrInvalid, not registry.ErrUnavailable", svc, err)
	}
	if took >= initialTimeout/2 {
		t.Fatalf("Instances(%q) took %v; want the refusal at once, not after InitialTimeout (%v)", svc, took, initialTimeout)
	}
}

func TestOpenURL(t *testing.T) {
	good := []struct {
		url  string
		want Config
	}{
		{"zk://h1:2181,h2:2181/services", Config{Servers: []string{"h1:2181", "h2:2181"}, Prefix: "/services",
			SessionTimeout: DefaultSessionTimeout, RequestTimeout: DefaultRequestTimeout}},
		{"zk://h1:2181", Config{Servers: []string{"h1:2181"}, Prefix: "/services",
			SessionTimeout: DefaultSessionTimeout, RequestTimeout: DefaultRequestTimeout}},
		{"zk://h1:2181/dabb/prod/?session_timeout=2s&request_timeout=500ms", Config{Servers: []string{"h1:2181"}, Prefix: "/dabb/prod",
			SessionTimeout: 2 * time.Second, RequestTimeout: 500 * time.Millisecond}},
	}
	for _, tt := range good {
		t.Run(tt.url, func(t *testing.T) {
			rr, err := registry.Open(context.Background(), tt.url)
			if err != nil {
				t.Fatal(err)
			}
			defer rr.Close()
			r, ok := rr.(*Registry)
			if !ok {
				t.Fatalf("Open returned %T", rr)
			}
			got := r.Config()
			if strings.Join(got.Servers, ",") != strings.Join(tt.want.Servers, ",") || got.Prefix != tt.want.Prefix ||
				got.SessionTimeout != tt.want.SessionTimeout || got.RequestTimeout != tt.want.RequestTimeout {
				t.Fatalf("config = %+v, want %+v", got, tt.want)
			}
		})
	}
	bad := []string{
		"zk:///services",
		"zk://h1:2181/services?session_timeout=soon",
		"zk://h1:2181/services?session_timeout=-1s",
		"zk://h1:2181/services?sessiontimeout=1s",
		"zk://user:pw@h1:2181/services",
		"zk://h1:2181/zookeeper",
	}
	for _, u := range bad {
		t.Run(u, func(t *testing.T) {
			if r, err := registry.Open(context.Background(), u); err == nil {
				r.Close()
				t.Fatalf("Open(%q) succeeded", u)
			}
		})
	}
}

// TestNoSessionIsUnavailable: ErrNoSession is also
// registry.ErrUnavailable, as the registry package documents for every
// backend.
func TestNoSessionIsUnavailable(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: 200 * time.Millisecond})
	err := r.Register(context.Background(), inst(serviceFor(t), "1"))
	if !errors.Is(err, ErrNoSession) {
		t.Fatalf("Register with ZooKeeper down = %v, want ErrNoSession", err)
	}
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Register with ZooKeeper down = %v: errors.Is(err, registry.ErrUnavailable) is false", err)
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

// TestSupplementaryCharRejected: ZooKeeper checks node names per UTF-16
// unit and refuses the surrogate range, so a character beyond U+FFFF (an
// emoji) is refused here, as ErrInvalid, before any request: Register
// would fail at the server and Watch would wait forever on a name no
// instance can have.
func TestSupplementaryCharRejected(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{zktest.Shared(t).Addr()}})
	svc := serviceFor(t)
	in := registry.Instance{Service: svc, ID: "a\U0001F600", Addr: "127.0.0.1:1"}
	if err := r.Register(ctxFor(t, 5*time.Second), in); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("Register(ID %q) = %v, want registry.ErrInvalid", in.ID, err)
	}
	if w, err := r.Watch(ctxFor(t, 5*time.Second), svc+"\U0001F600"); !errors.Is(err, registry.ErrInvalid) {
		if w != nil {
			w.Stop()
		}
		t.Errorf("Watch(%q) = %v, want registry.ErrInvalid: no instance can ever be registered under it", svc+"\U0001F600", err)
	}
}
