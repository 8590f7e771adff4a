package dabb_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	_ "github.com/dabbrpc/dabb/registry/etcd"
	_ "github.com/dabbrpc/dabb/registry/zk"
)

// registryServer is a real registry server a test can kill and restart.
type registryServer struct {
	url     string
	kill    func()
	restart func(t testing.TB)
}

var backends = []struct {
	name  string
	start func(t *testing.T) registryServer
}{
	{"etcd", func(t *testing.T) registryServer {
		s := etcdtest.Start(t)
		return registryServer{url: "etcd://" + s.Endpoint() + "/services?ttl=2s", kill: s.Kill, restart: s.Start}
	}},
	{"zk", func(t *testing.T) registryServer {
		s := zktest.Start(t)
		return registryServer{url: "zk://" + s.Addr() + "/services?session_timeout=2s", kill: s.Kill, restart: s.Start}
	}},
}

func openRegistry(t *testing.T, url string) registry.Registry {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	r, err := registry.Open(ctx, url)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// waitInstances waits until c knows exactly n instances of the probe.
func waitInstances(ctx context.Context, t *testing.T, c *proxy.Client, n int) {
	t.Helper()
	for {
		ins, err := c.Instances(ctx, probeDesc.Name)
		if err == nil && len(ins) == n {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("client knows %d instances (%v), want %d", len(ins), err, n)
		case <-time.After(20 * time.Millisecond): // polls the cache, which has no change event for tests
		}
	}
}

// TestRegistryOutage: with the registry killed, a client that already
// called keeps calling its cached instances without a failure; a new client
// process starts from the snapshot file and calls; when the registry is
// back, changes flow again.
func TestRegistryOutage(t *testing.T) {
	outage := 30 * time.Second
	if testing.Short() {
		outage = 3 * time.Second
	}
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			rs := b.start(t)
			serverReg := openRegistry(t, rs.url)
			p := newProbe()
			startServer(t, p, dabb.WithRegistry(serverReg))
			startServer(t, p, dabb.WithRegistry(serverReg))

			snapshot := filepath.Join(t.TempDir(), "instances.json")
			c, err := proxy.NewClient(openRegistry(t, rs.url), proxy.WithLogger(quiet),
				proxy.WithCache(registry.CacheConfig{SnapshotPath: snapshot, Logger: quiet}))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			waitInstances(ctx, t, c, 2)
			if _, err := call(ctx, c, "echo"); err != nil {
				t.Fatal(err)
			}

			rs.kill()
			var calls, failed atomic.Int64
			var firstErr atomic.Value
			stop := make(chan struct{})
			var wg sync.WaitGroup
			for range 4 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-stop:
							return
						default:
						}
						calls.Add(1)
						if _, err := call(ctx, c, "echo"); err != nil {
							failed.Add(1)
							firstErr.CompareAndSwap(nil, err)
						}
					}
				}()
			}
			// Meanwhile a new client process starts with the snapshot
			// file while the registry is down.
			out, err := snapshotClient(ctx, rs.url, snapshot)
			if err != nil {
				t.Errorf("new client process during the outage: %v\n%s", err, out)
			}
			time.Sleep(outage) // the length of the outage under test, not a synchronisation
			close(stop)
			wg.Wait()
			if failed.Load() != 0 {
				t.Fatalf("%d of %d calls failed while the registry was down; first: %v", failed.Load(), calls.Load(), firstErr.Load())
			}
			if calls.Load() < 100 {
				t.Fatalf("only %d calls during the outage", calls.Load())
			}
			t.Logf("%d calls, none failed, during a %v outage", calls.Load(), outage)

			// The registry comes back: a third instance becomes visible.
			rs.restart(t)
			startServer(t, p, dabb.WithRegistry(serverReg))
			waitInstances(ctx, t, c, 3)
		})
	}
}

// snapshotClient runs this test binary again as a client process that
// knows the registry URL and the snapshot file and nothing else.
func snapshotClient(ctx context.Context, url, snapshot string) (string, error) {
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSnapshotClientProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "DABB_SNAPSHOT_CLIENT="+url+"|"+snapshot)
	out, err := cmd.CombinedOutput()
	if err == nil && !strings.Contains(string(out), "snapshot client: 20 calls ok") {
		err = errors.New("the client process did not report its calls")
	}
	return string(out), err
}

// TestSnapshotClientProcess is the client process of TestRegistryOutage;
// it does nothing in a normal run.
func TestSnapshotClientProcess(t *testing.T) {
	env := os.Getenv("DABB_SNAPSHOT_CLIENT")
	if env == "" {
		t.Skip("runs only as the client process of TestRegistryOutage")
	}
	url, snapshot, _ := strings.Cut(env, "|")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := registry.Open(ctx, url)
	if err != nil {
		t.Fatalf("open %s: %v", url, err)
	}
	defer r.Close()
	c, err := proxy.NewClient(r, proxy.WithLogger(quiet),
		proxy.WithCache(registry.CacheConfig{SnapshotPath: snapshot, InitialTimeout: 300 * time.Millisecond, Logger: quiet}))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for i := range 20 {
		if _, err := call(ctx, c, "echo"); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
	fmt.Println("snapshot client: 20 calls ok")
}

// serverWithDeadEtcd returns a server (with opts) whose registry is an
// etcd nobody listens at, and a listener for it.
func serverWithDeadEtcd(t *testing.T, opts ...dabb.Option) (*dabb.Server, net.Listener) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close()
	reg := openRegistry(t, "etcd://"+dead+"/services?timeout=500ms&dial_timeout=200ms")
	s := dabb.NewServer(append([]dabb.Option{dabb.WithRegistry(reg), dabb.WithLogger(quiet)}, opts...)...)
	if err := s.RegisterService(&probeDesc, newProbe()); err != nil {
		t.Fatal(err)
	}
	sl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return s, sl
}

// TestServeFailsWhenRegistryIsDown: a server that cannot publish itself
// says so at start, within the registry's request timeout, instead of
// serving unseen; its listener is closed.
func TestServeFailsWhenRegistryIsDown(t *testing.T) {
	s, sl := serverWithDeadEtcd(t)
	start := time.Now()
	err := s.Serve(sl)
	if err == nil || !strings.Contains(err.Error(), "publish test.Probe") {
		t.Fatalf("Serve with the registry down returned %v, want a publish error", err)
	}
	if el := time.Since(start); el > 10*time.Second {
		t.Fatalf("Serve took %v to give up", el)
	}
	if c, err := net.DialTimeout("tcp", sl.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener is still open after Serve failed")
	}
	s.Close()
}

// TestServeWhileEtcdIsDown: with WithRegistryCheck(false), a server whose
// etcd cannot be reached serves anyway and keeps publishing in the
// background (etcd's errors count as unreachable); Close ends it, and the
// listener with it.
func TestServeWhileEtcdIsDown(t *testing.T) {
	s, sl := serverWithDeadEtcd(t, dabb.WithRegistryCheck(false))
	done := make(chan error, 1)
	go func() { done <- s.Serve(sl) }()
	c, err := net.DialTimeout("tcp", sl.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatalf("the server does not accept while etcd is down: %v", err)
	}
	c.Close()
	// The first publishing attempt takes the registry's 500 ms timeout;
	// Serve has not given up by well after it.
	select {
	case err := <-done:
		t.Fatalf("Serve returned %v with etcd down, want it serving", err)
	case <-time.After(2 * time.Second): // a bound on what must not happen
	}
	s.Close()
	select {
	case err := <-done:
		if !errors.Is(err, dabb.ErrServerClosed) {
			t.Errorf("Serve after Close = %v, want ErrServerClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Close")
	}
	if c, err := net.DialTimeout("tcp", sl.Addr().String(), time.Second); err == nil {
		c.Close()
		t.Fatal("the listener is still open after Close")
	}
}
