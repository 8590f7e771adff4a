package etcd

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
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

// TestKilledProviderDisappears runs a provider process, kills it with
// SIGKILL and expects its instance gone within TTL + 2 s.
func TestKilledProviderDisappears(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	const ttl = 2 * time.Second
	svc := service(t)
	watcher := newRegistry(t, srv, Config{})
	w, err := watcher.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "before the provider starts")

	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%s|p1|%s", providerEnv, srv.Endpoint(), svc, ttl))
	dieWithTest(cmd)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		if strings.TrimSpace(s) != "registered" {
			t.Fatalf("provider said %q, stderr: %s", s, stderr.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("provider did not register within 10s; stderr: %s", stderr.String())
	}
	waitSet(t, w, time.Second, "provider registered", "p1")

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	waitSet(t, w, ttl+2*time.Second, "provider killed")
	t.Logf("killed provider gone after %v (TTL %v)", time.Since(killed).Round(10*time.Millisecond), ttl)
}

// TestRevokedLeaseReRegisters revokes the registry's lease behind its back
// and expects the instance back within 5 s with no call from the user.
func TestRevokedLeaseReRegisters(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Shared(t)
	r := newRegistry(t, srv, Config{TTL: 2 * time.Second})
	consumer := newRegistry(t, srv, Config{})
	svc := service(t)
	ctx := ctxFor(t, 20*time.Second)
	if err := r.Register(ctx, registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	w, err := consumer.Watch(ctx, svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "registered", "a")

	old := r.leaseID()
	if _, err := newClient(t, srv).Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	waitSet(t, w, time.Second, "lease revoked")
	took := waitSet(t, w, 5*time.Second, "re-registered after the revoke", "a")
	if id := r.leaseID(); id == old || id == 0 {
		t.Errorf("lease after recovery = %x, want a new one (old %x)", int64(id), int64(old))
	}
	t.Logf("re-registered %v after the revoke was seen", took.Round(10*time.Millisecond))
}

// TestOutageLongerThanTTL stops etcd for longer than the lease TTL and
// expects the instance registered again within 5 s of etcd being back.
func TestOutageLongerThanTTL(t *testing.T) {
	t.Parallel()
	srv := etcdtest.Start(t)
	r := newRegistry(t, srv, Config{TTL: 2 * time.Second, RequestTimeout: time.Second})
	svc := service(t)
	ctx := ctxFor(t, 30*time.Second)
	in := registry.Instance{Service: svc, ID: "a", Addr: "127.0.0.1:1"}
	if err := r.Register(ctx, in); err != nil {
		t.Fatal(err)
	}
	old := r.leaseID()

	srv.Stop()
	// The lease is lost once the TTL passes without a keep-alive answer;
	// the registry then drops it and starts granting a new one.
	waitFor(t, 2*time.Second+3*time.Second, "the registry to notice the lost lease", func() bool { return r.leaseID() != old })

	srv.Start(t)
	back := time.Now()
	cli := newClient(t, srv)
	waitFor(t, 5*time.Second, "the instance on a new live lease", func() bool {
		gctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		resp, err := cli.Get(gctx, r.key(in))
		if err != nil || len(resp.Kvs) != 1 {
			return false
		}
		lease := clientv3.LeaseID(resp.Kvs[0].Lease)
		if lease == old || lease == 0 {
			return false
		}
		ttl, err := cli.TimeToLive(gctx, lease)
		return err == nil && ttl.TTL > 0
	})
	t.Logf("re-registered %v after etcd was back", time.Since(back).Round(10*time.Millisecond))
}

// waitFor polls cond (every 50 ms) until it holds, or fails after d.
// Used where the event is a server-side state with no notification.
func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, d, 50*time.Millisecond, what, cond)
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

func TestOpen(t *testing.T) {
	srv := etcdtest.Shared(t)
	ctx := ctxFor(t, 10*time.Second)
	tests := []struct {
		url     string
		wantErr bool
	}{
		{url: "etcd://" + srv.Endpoint() + "/custom-root?ttl=5s&timeout=2s"},
		{url: "etcd://" + srv.Endpoint() + ",127.0.0.1:1/custom-root"},
		{url: "etcd:///custom-root", wantErr: true},
		{url: "etcd://" + srv.Endpoint() + "/x?ttl=soon", wantErr: true},
		{url: "etcd://" + srv.Endpoint() + "/x?bogus=1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			r, err := registry.Open(ctx, tt.url)
			if tt.wantErr {
				if err == nil {
					r.Close()
					t.Fatalf("Open(%q) succeeded, want an error", tt.url)
				}
				t.Logf("error: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			in := registry.Instance{Service: service(t), ID: "a", Addr: "127.0.0.1:1"}
			if err := r.Register(ctx, in); err != nil {
				t.Fatal(err)
			}
			out, err := srv.Ctl(ctx, "get", "--keys-only", "/custom-root/"+in.Service+"/a")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), "/custom-root/"+in.Service+"/a") {
				t.Fatalf("key not under the URL's prefix; etcdctl: %q", out)
			}
		})
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
