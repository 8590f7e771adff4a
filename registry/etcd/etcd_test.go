package etcd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/registrytest"
)

// providerEnv makes the test binary act as a provider process: it
// registers one instance and blocks until killed.
const providerEnv = "DABB_ETCD_TEST_PROVIDER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(providerEnv); spec != "" {
		os.Exit(runProvider(spec))
	}
	goleak.VerifyTestMain(etcdtest.WithShared(m))
}

// runProvider serves providerEnv: "endpoint|service|id|ttl".
func runProvider(spec string) int {
	f := strings.Split(spec, "|")
	if len(f) != 4 {
		fmt.Fprintln(os.Stderr, "provider: bad spec", spec)
		return 2
	}
	ttl, err := time.ParseDuration(f[3])
	if err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		return 2
	}
	r, err := New(Config{Endpoints: []string{f[0]}, TTL: ttl})
	if err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.Register(ctx, registry.Instance{Service: f[1], ID: f[2], Addr: "127.0.0.1:20880"}); err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		return 1
	}
	fmt.Println("registered")
	select {} // until SIGKILL
}

var quiet = slog.New(slog.DiscardHandler)

// newRegistry returns a registry for srv that is closed when t ends.
func newRegistry(t *testing.T, srv *etcdtest.Server, cfg Config) *Registry {
	t.Helper()
	cfg.Endpoints = []string{srv.Endpoint()}
	if cfg.Logger == nil {
		cfg.Logger = quiet
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// newClient returns a plain etcd client, closed when t ends.
func newClient(t *testing.T, srv *etcdtest.Server) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}, Logger: nopZap})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	return cli
}

var serial atomic.Int64

func service(t *testing.T) string {
	return fmt.Sprintf("etcdtest.%s.%d.%d", strings.ReplaceAll(t.Name(), "/", "."), time.Now().UnixNano(), serial.Add(1))
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// waitSet calls Next until it returns want (by ID set), or fails after d.
func waitSet(t *testing.T, w registry.Watcher, d time.Duration, step string, wantIDs ...string) time.Duration {
	t.Helper()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last []registry.Instance
	for {
		got, err := w.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				t.Fatalf("%s: no set with IDs %v within %v (last %v): %v", step, wantIDs, d, ids(last), err)
			}
			continue // an outage report; the next call returns the set
		}
		if strings.Join(ids(got), ",") == strings.Join(wantIDs, ",") {
			return time.Since(start)
		}
		last = got
	}
}

func ids(set []registry.Instance) []string {
	out := make([]string, len(set))
	for i, in := range registry.SortedCopy(set) {
		out[i] = in.ID
	}
	return out
}

func TestConformance(t *testing.T) {
	srv := etcdtest.Shared(t)
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		return newRegistry(t, srv, Config{})
	})
}

func TestLayout(t *testing.T) {
	srv := etcdtest.Shared(t)
	r := newRegistry(t, srv, Config{})
	ctx := ctxFor(t, 10*time.Second)
	in := registry.Instance{
		Service:  "inventory.Inventory",
		ID:       "10.0.0.7:20880",
		Addr:     "10.0.0.7:20880",
		Weight:   100,
		Metadata: map[string]string{"version": "1.4.0", "zone": "eu-1"},
	}
	if err := r.Register(ctx, in); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Deregister(context.Background(), in) })
	out, err := srv.Ctl(ctx, "get", "--prefix", "/services/inventory.Inventory/")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("etcdctl --endpoints %s get --prefix /services/inventory.Inventory/\n%s", srv.Endpoint(), out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 2 {
		t.Fatalf("etcdctl output has %d lines, want key and value:\n%s", len(lines), out)
	}
	if want := "/services/inventory.Inventory/10.0.0.7:20880"; lines[0] != want {
		t.Errorf("key = %q, want %q", lines[0], want)
	}
	var got registry.Instance
	if err := json.Unmarshal([]byte(lines[1]), &got); err != nil {
		t.Fatalf("value %q is not JSON: %v", lines[1], err)
	}
	if !registry.EqualSets([]registry.Instance{got}, []registry.Instance{in}) {
		t.Errorf("value = %+v, want %+v", got, in)
	}
	out, err = srv.Ctl(ctx, "get", "--prefix", "-w", "json", "/services/inventory.Inventory/")
	if err != nil {
		t.Fatal(err)
	}
	var resp struct {
		KVs []struct {
			Lease int64 `json:"lease"`
		} `json:"kvs"`
	}
	if err := json.Unmarshal(out, &resp); err != nil {
		t.Fatal(err)
	}
	if len(resp.KVs) != 1 || resp.KVs[0].Lease == 0 || resp.KVs[0].Lease != int64(r.leaseID()) {
		t.Errorf("key's lease = %+v, want the registry's lease %x", resp.KVs, int64(r.leaseID()))
	}
}

// waitFor polls cond (every 50 ms) until it holds, or fails after d.
// Used where the event is a server-side state with no notification.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, d, 50*time.Millisecond, what, cond)
}

// TestCallsFailWhenDown: with no etcd, every call returns an error within
// RequestTimeout instead of hanging.
func TestCallsFailWhenDown(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	srv.Stop()
	const timeout = 500 * time.Millisecond
	r := newRegistry(t, srv, Config{RequestTimeout: timeout})
	svc := service(t)
	in := registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}
	calls := []struct {
		name string
		call func(ctx context.Context) error
	}{
		{"Register", func(ctx context.Context) error { return r.Register(ctx, in) }},
		{"Deregister", func(ctx context.Context) error { return r.Deregister(ctx, in) }},
		{"Watch", func(ctx context.Context) error {
			w, err := r.Watch(ctx, svc)
			if err == nil {
				w.Stop()
			}
			return err
		}},
	}
	for _, c := range calls {
		t.Run(c.name, func(t *testing.T) {
			start := time.Now()
			err := c.call(context.Background()) // no deadline of its own
			took := time.Since(start)
			if err == nil {
				t.Fatalf("%s with etcd down succeeded", c.name)
			}
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Logf("%s error: %v", c.name, err)
			}
			if took > timeout+500*time.Millisecond {
				t.Fatalf("%s took %v with RequestTimeout %v", c.name, took, timeout)
			}
		})
	}
	start := time.Now()
	r.Close()
	if took := time.Since(start); took > timeout+time.Second {
		t.Fatalf("Close took %v with etcd down", took)
	}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     Config
		wantErr bool
	}{
		{"NoEndpoints", Config{}, true},
		{"EmptyEndpoint", Config{Endpoints: []string{" "}}, true},
		{"NegativeTTL", Config{Endpoints: []string{"127.0.0.1:1"}, TTL: -time.Second}, true},
		{"NothingListening", Config{Endpoints: []string{"127.0.0.1:1"}}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			r, err := New(tt.cfg)
			if took := time.Since(start); took > 500*time.Millisecond {
				t.Errorf("New took %v; it must not wait for the network", took)
			}
			if tt.wantErr {
				if err == nil {
					r.Close()
					t.Fatal("New succeeded, want an error")
				}
				if !errors.Is(err, registry.ErrInvalid) {
					t.Errorf("error %v does not wrap registry.ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if r.cfg.TTL != DefaultTTL || r.cfg.RequestTimeout != DefaultRequestTimeout || r.cfg.Prefix != registry.DefaultPrefix {
				t.Errorf("defaults not applied: %+v", r.cfg)
			}
			if err := r.Close(); err != nil {
				t.Errorf("Close of an unused registry: %v", err)
			}
		})
	}
}

// TestDeregisterDuringOutage: a Deregister that fails because etcd is down
// still takes the instance out once etcd is back; the key must not live
// on the lease the registry keeps renewing.
func TestDeregisterDuringOutage(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	r := newRegistry(t, srv, Config{TTL: 2 * time.Second, RequestTimeout: 500 * time.Millisecond})
	svc := service(t)
	in := registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}
	if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	if err := r.Deregister(ctxFor(t, 300*time.Millisecond), in); err == nil {
		t.Fatal("Deregister succeeded with etcd down")
	}
	srv.Start(t)
	cli := newClient(t, srv)
	ctx := ctxFor(t, 20*time.Second)
	resp, err := cli.Get(ctx, r.key(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return // already deleted
	}
	// Await the deletion as an event, from the revision just read.
	for wr := range cli.Watch(ctx, r.key(in), clientv3.WithRev(resp.Header.Revision+1)) {
		for _, ev := range wr.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return
			}
		}
	}
	t.Fatalf("the deregistered key was not deleted within 20s of etcd coming back: %v", ctx.Err())
}

// freezingProxy forwards TCP to an address until freeze: from then on it
// forwards nothing and closes nothing, as a host that vanished without a
// FIN or a route that drops packets.
type freezingProxy struct {
	l      net.Listener
	target string
	frozen chan struct{}
	once   sync.Once
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  []net.Conn
}

func startFreezingProxy(t *testing.T, target string) *freezingProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezingProxy{l: l, target: target, frozen: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		p.l.Close()
		p.freeze()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *freezingProxy) addr() string { return p.l.Addr().String() }

func (p *freezingProxy) freeze() { p.once.Do(func() { close(p.frozen) }) }

func (p *freezingProxy) accept() {
	for {
		c, err := p.l.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		p.mu.Unlock()
		select {
		case <-p.frozen:
			continue // accepted and never answered
		default:
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, up)
		p.mu.Unlock()
		p.wg.Go(func() { p.pipe(up, c) })
		p.wg.Go(func() { p.pipe(c, up) })
	}
}

// pipe copies from src to dst until freeze or an error; once frozen it
// drops what it reads, so neither side sees the connection end.
func (p *freezingProxy) pipe(dst, src net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		select {
		case <-p.frozen:
			n = 0
		default:
		}
		if n > 0 {
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// TestHalfOpenConnectionIsAnOutage: when the path to etcd silently stops
// carrying packets (no FIN, no RST), the keepalive pings notice: the
// watcher reports the outage instead of staying quiet for as long as TCP
// takes to give up (~15 minutes).
func TestHalfOpenConnectionIsAnOutage(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	p := startFreezingProxy(t, srv.Endpoint())
	r, err := New(Config{Endpoints: []string{p.addr()}, RequestTimeout: time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	provider := newRegistry(t, srv, Config{})
	svc := service(t)
	ctx := ctxFor(t, 60*time.Second)
	if err := provider.Register(ctx, registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	w, err := r.Watch(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, 5*time.Second, "before the path goes silent", "a")

	p.freeze()
	frozen := time.Now()
	got, err := w.Next(ctxFor(t, 40*time.Second))
	if !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Next after the path went silent = %v, %v; want an error wrapping ErrUnavailable within 40s", ids(got), err)
	}
	t.Logf("outage reported %v after the path went silent", time.Since(frozen).Round(100*time.Millisecond))
}
