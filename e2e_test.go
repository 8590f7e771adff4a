// End-to-end tests of the client's resilience: real servers, some in
// processes of their own so they can be killed, found through real
// registries that can be killed too.

package dabb_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	_ "github.com/dabbrpc/dabb/registry/etcd"
	_ "github.com/dabbrpc/dabb/registry/zk"
	"github.com/dabbrpc/dabb/transport"
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
			l := startLoad(ctx, c, 4)
			// Meanwhile a new client process starts with the snapshot
			// file while the registry is down.
			out, err := snapshotClient(ctx, rs.url, snapshot)
			if err != nil {
				t.Errorf("new client process during the outage: %v\n%s", err, out)
			}
			time.Sleep(outage) // the length of the outage under test, not a synchronisation
			calls, failed, firstErr := l.end()
			if failed != 0 {
				t.Fatalf("%d of %d calls failed while the registry was down; first: %v", failed, calls, firstErr)
			}
			if calls < 100 {
				t.Fatalf("only %d calls during the outage", calls)
			}
			t.Logf("%d calls, none failed, during a %v outage", calls, outage)

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

// loadDuration is how long each load test runs.
func loadDuration() time.Duration {
	if testing.Short() {
		return 4 * time.Second
	}
	return 20 * time.Second
}

// TestProbeServerProcess is the server process of the tests below; it does
// nothing in a normal run. It serves the probe on a loopback port, prints
// the address, appends the idempotency key of every Do it runs to a log
// file (unbuffered, so a SIGKILL loses nothing written), and runs until
// killed.
func TestProbeServerProcess(t *testing.T) {
	logPath := os.Getenv("DABB_PROBE_SERVER_LOG")
	if logPath == "" {
		t.Skip("runs only as the server process of the resilience tests")
	}
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	p := newProbe()
	p.record = func(ctx context.Context) {
		if k := dabb.IdempotencyKey(ctx); k != "" {
			f.Write([]byte(k + "\n"))
		}
	}
	opts := []dabb.Option{dabb.WithLogger(quiet)}
	if url := os.Getenv("DABB_PROBE_SERVER_REGISTRY"); url != "" {
		ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
		reg, err := registry.Open(ctx, url)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, dabb.WithRegistry(reg))
	}
	s := dabb.NewServer(opts...)
	if err := s.RegisterService(&probeDesc, p); err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Printf("listening %s\n", l.Addr())
	s.Serve(l) // until killed
}

// serverProcess is a probe server in a child process.
type serverProcess struct {
	addr, log string
	cmd       *exec.Cmd
}

// startServerProcess starts probe server number n, publishing itself to
// the registry at regURL.
func startServerProcess(t *testing.T, dir string, n int, regURL string) *serverProcess {
	t.Helper()
	sp := &serverProcess{log: filepath.Join(dir, fmt.Sprintf("server-%d.log", n))}
	sp.cmd = exec.Command(os.Args[0], "-test.run=^TestProbeServerProcess$", "-test.timeout=10m")
	sp.cmd.Env = append(os.Environ(), "DABB_PROBE_SERVER_LOG="+sp.log, "DABB_PROBE_SERVER_REGISTRY="+regURL)
	out, err := sp.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sp.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sp.cmd.Process.Kill(); sp.cmd.Wait() })
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "listening "); ok {
				line <- a
				break
			}
		}
		close(line)
		for sc.Scan() { // drain, so the child never blocks on stdout
		}
	}()
	select {
	case a, ok := <-line:
		if !ok {
			t.Fatal("server process exited before listening")
		}
		sp.addr = a
	case <-time.After(30 * time.Second):
		t.Fatal("server process did not start listening within 30 s")
	}
	return sp
}

// load runs callers goroutines calling fn back to back until d has passed,
// running at(…) once at half time, and returns the calls made and the
// errors met.
func load(ctx context.Context, callers int, d time.Duration, at func(), fn func(ctx context.Context) error) (calls int64, errs []error) {
	var n atomic.Int64
	var mu sync.Mutex
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				n.Add(1)
				if err := fn(ctx); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		}()
	}
	half := time.NewTimer(d / 2)
	end := time.NewTimer(d)
	<-half.C
	if at != nil {
		at()
	}
	<-end.C
	close(stop)
	wg.Wait()
	return n.Load(), errs
}

func TestKillInstanceUnderLoad(t *testing.T) {
	for _, idempotent := range []bool{true, false} {
		name := "idempotent"
		if !idempotent {
			name = "not idempotent"
		}
		t.Run(name, func(t *testing.T) {
			dir := t.TempDir()
			regURL := "etcd://" + etcdtest.Start(t).Endpoint() + "/services?ttl=2s"
			var procs []*serverProcess
			for i := range 3 {
				procs = append(procs, startServerProcess(t, dir, i, regURL))
			}
			c, err := proxy.NewClient(openRegistry(t, regURL), proxy.WithLogger(quiet))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 2*loadDuration()+time.Minute)
			defer cancel()
			waitInstances(ctx, t, c, 3)
			var opts []proxy.CallOption
			if idempotent {
				opts = append(opts, proxy.Idempotent())
			}
			kill := func() {
				if err := procs[1].cmd.Process.Kill(); err != nil {
					t.Errorf("kill: %v", err)
				}
			}
			calls, errs := load(ctx, 200, loadDuration(), kill, func(ctx context.Context) error {
				_, err := call(ctx, c, "echo", opts...)
				return err
			})
			t.Logf("%d calls, %d failed", calls, len(errs))
			if calls < 1000 {
				t.Fatalf("only %d calls in %v", calls, loadDuration())
			}
			if idempotent && len(errs) > 0 {
				t.Fatalf("%d of %d idempotent calls failed; first: %v", len(errs), calls, errs[0])
			}
			for _, err := range errs {
				var pe *protocol.Error
				if !errors.As(err, &pe) {
					t.Fatalf("failure without a status: %v", err)
				}
				switch pe.Status {
				case protocol.StatusChannelInactive, protocol.StatusServerTimeout:
				default:
					t.Fatalf("failure with status %v: %v", pe.Status, err)
				}
			}
			if idempotent {
				return
			}
			// No non-idempotent call ran twice on the servers, the killed
			// one included.
			seen := map[string]int{}
			total := 0
			for _, sp := range procs {
				data, err := os.ReadFile(sp.log)
				if err != nil {
					t.Fatal(err)
				}
				for _, k := range strings.Split(strings.TrimSpace(string(data)), "\n") {
					if k == "" {
						continue
					}
					seen[k]++
					total++
				}
			}
			var twice []string
			for k, n := range seen {
				if n > 1 {
					twice = append(twice, k)
				}
			}
			if len(twice) > 0 {
				slices.Sort(twice)
				t.Fatalf("%d calls ran more than once (e.g. %s)", len(twice), twice[0])
			}
			if total < int(calls)-len(errs)-200 { // every successful call ran once
				t.Fatalf("servers ran %d calls, clients saw %d succeed", total, int(calls)-len(errs))
			}
		})
	}
}

func TestSlowInstanceAvoided(t *testing.T) {
	var probes []*probe
	var addrs []string
	for range 3 {
		p := newProbe()
		_, a := startServer(t, p)
		probes = append(probes, p)
		addrs = append(addrs, a)
	}
	c := newClient(t, addrs...)
	ctx, cancel := context.WithTimeout(context.Background(), 2*loadDuration()+time.Minute)
	defer cancel()
	for range 300 { // warm up: every instance has answered fast
		if _, err := call(ctx, c, "echo", proxy.Idempotent()); err != nil {
			t.Fatal(err)
		}
	}
	d := loadDuration()
	slow := probes[2]
	const slowDelay = 200 * time.Millisecond
	slow.delay.Store(int64(slowDelay))
	start := time.Now()
	var (
		mu        sync.Mutex
		latencies []time.Duration // of calls started in the last half
		counted   atomic.Bool
	)
	var before [3]int64
	time.AfterFunc(2*time.Second, func() {
		for i, p := range probes {
			before[i] = p.ran.Load()
		}
		counted.Store(true)
	})
	_, errs := load(ctx, 32, d, nil, func(ctx context.Context) error {
		t0 := time.Now()
		_, err := call(ctx, c, "echo", proxy.Idempotent())
		if t0.Sub(start) > d/2 {
			mu.Lock()
			latencies = append(latencies, time.Since(t0))
			mu.Unlock()
		}
		return err
	})
	if len(errs) > 0 {
		t.Fatalf("%d calls failed; first: %v", len(errs), errs[0])
	}
	if !counted.Load() {
		t.Fatal("the run ended before the measuring window began")
	}
	var after [3]int64
	for i, p := range probes {
		after[i] = p.ran.Load() - before[i]
	}
	total := after[0] + after[1] + after[2]
	share := float64(after[2]) / float64(total)
	slices.Sort(latencies)
	p99 := latencies[len(latencies)*99/100]
	t.Logf("from 2 s after one instance turned slow: %d calls, %d (%.2f%%) on it; p99 over the last %v: %v",
		total, after[2], 100*share, d/2, p99)
	if share > 0.10 {
		t.Errorf("the slow instance took %.1f%% of the calls, want at most 10%%", 100*share)
	}
	// Under a quarter of the slow instance's delay: the p99 call did not
	// wait for it.
	if p99 > slowDelay/4 {
		t.Errorf("p99 %v, want under %v, a quarter of the slow instance's delay", p99, slowDelay/4)
	}
}

// countingObserver counts attempts.
type countingObserver struct{ attempts, retries atomic.Int64 }

func (o *countingObserver) Attempted(_, _, _ string, _ protocol.Status, _ time.Duration) {
	o.attempts.Add(1)
}
func (o *countingObserver) Retried(_, _ string, _ protocol.Status) { o.retries.Add(1) }
func (o *countingObserver) BreakerChanged(_, _, _ string)          {}

func TestRetryBudgetWhenServiceDown(t *testing.T) {
	// Three instances that are all down: every attempt fails before
	// sending, which any method may retry, so only the budget holds the
	// retries back.
	var addrs []string
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, l.Addr().String())
		l.Close()
	}
	obs := &countingObserver{}
	c := newClientWith(t, []proxy.Option{
		proxy.WithObserver(obs),
		proxy.WithBreaker(proxy.BreakerConfig{Disabled: true}), // count the budget alone
		proxy.WithTransport(transport.Config{}),
	}, addrs...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	d := 10 * time.Second
	if testing.Short() {
		d = 3 * time.Second
	}
	first := time.Now().Unix()
	calls, errs := load(ctx, 32, d, nil, func(ctx context.Context) error {
		_, err := call(ctx, c, "echo", proxy.Idempotent())
		return err
	})
	if int64(len(errs)) != calls {
		t.Fatalf("%d of %d calls succeeded against dead instances", calls-int64(len(errs)), calls)
	}
	attempts := obs.attempts.Load()
	// The budget: 10% of each second's calls, plus a floor of 10 retries
	// a second saved up over 10 s. A run that spans more than 10 s gets
	// the saved floor once per 10 s it spans.
	spanned := time.Now().Unix() - first + 1
	windows := (spanned + 9) / 10
	// Each window may also round its 10% up by one retry.
	limit := float64(calls)*1.1 + float64(100*windows) + float64(windows)
	t.Logf("%d calls, %d attempts, %d retries; limit %.0f", calls, attempts, obs.retries.Load(), limit)
	if float64(attempts) > limit {
		t.Fatalf("%d attempts for %d calls, over the budget's %.0f", attempts, calls, limit)
	}
	if obs.retries.Load() == 0 {
		t.Fatal("no retries at all: the test proves nothing")
	}
}

// callLoad is n goroutines calling the probe back to back until end.
type callLoad struct {
	calls, failed atomic.Int64
	firstErr      atomic.Value
	stop          chan struct{}
	wg            sync.WaitGroup
}

// startLoad starts n callers of c.
func startLoad(ctx context.Context, c *proxy.Client, n int) *callLoad {
	l := &callLoad{stop: make(chan struct{})}
	for range n {
		l.wg.Go(func() {
			for {
				select {
				case <-l.stop:
					return
				default:
				}
				l.calls.Add(1)
				if _, err := call(ctx, c, "echo"); err != nil {
					l.failed.Add(1)
					l.firstErr.CompareAndSwap(nil, err)
				}
			}
		})
	}
	return l
}

// end stops the callers and returns the calls made, those that failed
// and the first failure.
func (l *callLoad) end() (calls, failed int64, firstErr any) {
	close(l.stop)
	l.wg.Wait()
	return l.calls.Load(), l.failed.Load(), l.firstErr.Load()
}
