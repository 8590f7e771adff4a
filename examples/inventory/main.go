// Command inventory is dabb's demo: an inventory service with Deduct and
// Stock, three instances published to a registry, and a client that finds
// them, spreads a workload over them and follows one of them shutting down.
//
//	go run ./examples/inventory                      # everything in one process, embedded etcd
//	go run ./examples/inventory -registry zk://127.0.0.1:2181/services
//	go run ./examples/inventory -registry etcd://127.0.0.1:2379/services
//
// Two terminals, without a registry server:
//
//	go run ./examples/inventory -mode server -addr 127.0.0.1:20880
//	go run ./examples/inventory -mode client -registry static://127.0.0.1:20880
//
// In a Dubbo estate, the server also serves the Java interface
// com.example.inventory.InventoryService (boolean deduct(long sku, int
// count), long stock(long sku), DeductReply deductOnce(DeductRequest req))
// and publishes it in Dubbo's ZooKeeper layout under /dubbo:
//
//	go run ./examples/inventory -mode server -addr 127.0.0.1:20880 -registry zookeeper://127.0.0.1:2181
//
// In server mode, -require-token admits only calls that carry the bearer
// token in $INVENTORY_TOKEN; the client mode sends none.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/examples/internal/etcdembed"
	"github.com/dabbrpc/dabb/internal/inventory"
	pb "github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	_ "github.com/dabbrpc/dabb/registry/etcd"
	_ "github.com/dabbrpc/dabb/registry/static"
	_ "github.com/dabbrpc/dabb/registry/zk"
)

func main() {
	var cfg config
	flag.StringVar(&cfg.mode, "mode", "demo", "demo (servers and client in one process), server, or client")
	flag.StringVar(&cfg.registry, "registry", "", "registry URL (zk://, etcd://, static://, or zookeeper:// for Dubbo's layout); default: an embedded etcd (demo) or none (server)")
	flag.StringVar(&cfg.addr, "addr", "127.0.0.1:20880", "listen address (server mode)")
	flag.IntVar(&cfg.instances, "instances", 3, "instances to start (demo mode)")
	flag.IntVar(&cfg.calls, "calls", 3000, "calls per phase (demo and client modes)")
	flag.IntVar(&cfg.workers, "workers", 32, "concurrent callers")
	flag.BoolVar(&cfg.verbose, "v", false, "log dabb's own messages")
	requireToken := flag.Bool("require-token", false, "server mode: admit only calls with the bearer token in $"+tokenEnv+" (health checks need none)")
	flag.Parse()
	if *requireToken {
		if cfg.token = os.Getenv(tokenEnv); cfg.token == "" {
			fmt.Fprintf(os.Stderr, "inventory: -require-token needs the token in $%s\n", tokenEnv)
			os.Exit(2)
		}
	}

	level := slog.LevelWarn
	if cfg.verbose {
		level = slog.LevelDebug
	}
	slog.SetDefault(slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})))

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cfg.mode {
	case "demo":
		err = runDemo(ctx, os.Stdout, cfg)
	case "server":
		err = runServer(ctx, os.Stdout, cfg)
	case "client":
		err = runClient(ctx, os.Stdout, cfg)
	default:
		err = fmt.Errorf("unknown -mode %q: want demo, server or client", cfg.mode)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "inventory:", err)
		os.Exit(1)
	}
}

type config struct {
	mode, registry, addr string
	instances, calls     int
	workers              int
	verbose              bool
	// token, when set, is the bearer token the server requires
	// (-require-token).
	token string
}

// tokenEnv names the environment variable -require-token reads.
const tokenEnv = "INVENTORY_TOKEN"

// skus is the demo's catalogue and its starting stock. Java callers name
// "10086" by the long 10086.
var skus = map[string]int64{"sku-1": 1_000_000, "sku-2": 1_000_000, "sku-3": 1_000_000, "sku-4": 1_000_000, "10086": 1_000_000}

// openRegistry opens the registry named by url, or starts an embedded etcd
// in a temporary directory when url is empty.
func openRegistry(ctx context.Context, w io.Writer, url string) (registry.Registry, func(), error) {
	cleanup := func() {}
	if url == "" {
		dir, err := os.MkdirTemp("", "dabb-demo-etcd-")
		if err != nil {
			return nil, nil, err
		}
		endpoint, stopEtcd, err := etcdembed.Start(ctx, dir)
		if err != nil {
			os.RemoveAll(dir)
			return nil, nil, fmt.Errorf("start embedded etcd: %w", err)
		}
		cleanup = func() { stopEtcd(); os.RemoveAll(dir) }
		url = "etcd://" + strings.TrimPrefix(endpoint, "http://") + "/services"
		fmt.Fprintf(w, "registry: embedded etcd at %s\n", endpoint)
	} else {
		fmt.Fprintf(w, "registry: %s\n", url)
	}
	reg, err := registry.Open(ctx, url)
	if err != nil {
		cleanup()
		return nil, nil, err
	}
	return reg, func() { reg.Close(); cleanup() }, nil
}

// instance is one running server of the demo.
type instance struct {
	srv   *dabb.Server
	addr  string
	calls atomic.Int64
	done  chan error
}

// counting wraps the shared store to count the calls each instance serves.
type counting struct {
	inventory.Inventory
	n *atomic.Int64
}

func (c counting) Deduct(ctx context.Context, req *pb.DeductRequest) (*pb.DeductReply, error) {
	c.n.Add(1)
	return c.Inventory.Deduct(ctx, req)
}

func (c counting) Stock(ctx context.Context, req *pb.StockRequest) (*pb.StockReply, error) {
	c.n.Add(1)
	return c.Inventory.Stock(ctx, req)
}

func startInstance(store inventory.Inventory, reg registry.Registry, addr string) (*instance, error) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	in := &instance{addr: l.Addr().String(), done: make(chan error, 1)}
	in.srv = dabb.NewServer(dabb.WithRegistry(reg))
	if err := inventory.RegisterInventoryServer(in.srv, counting{store, &in.calls}); err != nil {
		l.Close()
		return nil, err
	}
	ready := make(chan struct{})
	go func() {
		close(ready)
		in.done <- in.srv.Serve(l)
	}()
	<-ready
	return in, nil
}

func (in *instance) shutdown(ctx context.Context) error {
	err := in.srv.Shutdown(ctx)
	if serr := <-in.done; serr != nil && !errors.Is(serr, dabb.ErrServerClosed) {
		err = errors.Join(err, serr)
	}
	return err
}

// runDemo starts the instances and a client in this process; halfway
// through the workload one instance shuts down gracefully, and the summary
// shows the client followed.
func runDemo(ctx context.Context, w io.Writer, cfg config) error {
	if isDubboRegistry(cfg.registry) {
		return errors.New("demo mode needs a registry dabb's client reads (zk://, etcd://); zookeeper:// lists Java interfaces for Dubbo consumers: use it with -mode server")
	}
	reg, closeReg, err := openRegistry(ctx, w, cfg.registry)
	if err != nil {
		return err
	}
	defer closeReg()

	// The instances share one store, as real ones share one database.
	store := inventory.NewStore(skus)
	var ins []*instance
	defer func() {
		for _, in := range ins {
			in.srv.Close()
		}
	}()
	for range cfg.instances {
		in, err := startInstance(store, reg, "127.0.0.1:0")
		if err != nil {
			return fmt.Errorf("start instance: %w", err)
		}
		ins = append(ins, in)
	}
	fmt.Fprintf(w, "instances: %d published as %s\n", len(ins), inventory.InventoryServiceName)

	client, err := proxy.NewClient(reg)
	if err != nil {
		return err
	}
	defer client.Close()
	inv := inventory.NewInventoryClient(client)

	if err := waitForInstances(ctx, client, len(ins)); err != nil {
		return err
	}

	// Halfway through the workload the last instance shuts down
	// gracefully while calls keep flowing.
	victim := ins[len(ins)-1]
	var before map[string]int64
	shutdownErr := make(chan error, 1)
	mid := func() {
		before = snapshot(ins)
		if len(ins) < 2 {
			shutdownErr <- nil
			return
		}
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		shutdownErr <- victim.shutdown(sctx)
	}
	res := runWorkload(ctx, inv, cfg, "demo", int64(cfg.calls), mid)
	if err := <-shutdownErr; err != nil {
		return fmt.Errorf("shut down %s: %w", victim.addr, err)
	}
	after := snapshot(ins)
	if len(ins) > 1 {
		fmt.Fprintf(w, "halfway through the workload, %s shut down gracefully (withdrawn from the registry, then drained)\n", victim.addr)
	}

	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "instance\tcalls served before\tfrom then on\t")
	for _, in := range ins {
		note := ""
		if in == victim && len(ins) > 1 {
			note = "  (shutting down: calls sent before the client learned it)"
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\n", in.addr, before[in.addr], after[in.addr]-before[in.addr], note)
	}
	tw.Flush()
	fmt.Fprintln(w)
	res.print(w, "workload")
	return verify(ctx, w, inv, store, res)
}

// verify checks that the stock went down by exactly what was deducted once
// per request id, and prints the outcome.
func verify(ctx context.Context, w io.Writer, inv inventory.Inventory, store *inventory.Store, results ...result) error {
	var want, failed int64
	for _, r := range results {
		want += r.units
		failed += r.failed
	}
	var left int64
	for sku := range skus {
		reply, err := inv.Stock(ctx, &pb.StockRequest{Sku: sku})
		if err != nil {
			return fmt.Errorf("stock %s: %w", sku, err)
		}
		left += reply.GetCount()
	}
	var total int64
	for _, v := range skus {
		total += v
	}
	_, deducted, dups := store.Stats()
	fmt.Fprintf(w, "deducted %d units for %d distinct request ids; %d repeated ids answered without deducting again\n", deducted, want, dups)
	if failed > 0 {
		// A call that failed after it was sent may have deducted: the
		// stock check cannot tell, so the failures are the finding.
		return fmt.Errorf("%d calls failed (%d units gone, %d deducted, %d by the calls that succeeded)",
			failed, total-left, deducted, want)
	}
	if total-left != want || deducted != want {
		return fmt.Errorf("stock is off: %d units gone, %d deducted, want %d", total-left, deducted, want)
	}
	fmt.Fprintln(w, "stock consistent, no failed calls")
	return nil
}

func snapshot(ins []*instance) map[string]int64 {
	m := make(map[string]int64, len(ins))
	for _, in := range ins {
		m[in.addr] = in.calls.Load()
	}
	return m
}

// waitForInstances waits until the client sees n instances answer Stock.
func waitForInstances(ctx context.Context, c *proxy.Client, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	inv := inventory.NewInventoryClient(c)
	for {
		if got, err := c.Instances(ctx, inventory.InventoryServiceName); err == nil && len(got) >= n {
			if _, err := inv.Stock(ctx, &pb.StockRequest{Sku: "sku-1"}); err == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %d instances: %w", n, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// result sums up one workload run.
type result struct {
	calls, failed, units, repeats int64
	elapsed                       time.Duration
	latencies                     []time.Duration
	firstErr                      error
}

func (r result) print(w io.Writer, name string) {
	slices.Sort(r.latencies)
	q := func(p float64) time.Duration {
		if len(r.latencies) == 0 {
			return 0
		}
		return r.latencies[int(p*float64(len(r.latencies)-1))]
	}
	fmt.Fprintf(w, "%s: %d calls (%d deliberate retries of a request id) in %v, %.0f calls/s, p50 %v, p99 %v, %d failed\n",
		name, r.calls, r.repeats, r.elapsed.Round(time.Millisecond), float64(r.calls)/r.elapsed.Seconds(),
		q(0.50).Round(time.Microsecond), q(0.99).Round(time.Microsecond), r.failed)
	if r.firstErr != nil {
		fmt.Fprintf(w, "  first error: %v\n", r.firstErr)
	}
}

// runWorkload makes calls from cfg.workers goroutines: mostly Deducts of
// one unit, every tenth repeated with the same request id as a retry would
// be, and a Stock every fifth call. When the count reaches at, mid runs in
// its own goroutine while the workload goes on; with mid nil, the workload
// makes cfg.calls calls.
func runWorkload(ctx context.Context, inv inventory.Inventory, cfg config, phase string, at int64, mid func()) result {
	total := int64(cfg.calls)
	if mid != nil {
		total = 2 * at
	}
	var (
		mu  sync.Mutex
		res result
		wg  sync.WaitGroup
		seq atomic.Int64
	)
	names := make([]string, 0, len(skus))
	for k := range skus {
		names = append(names, k)
	}
	sort.Strings(names)
	start := time.Now()
	for range cfg.workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var local result
			for {
				i := seq.Add(1)
				if i > total || ctx.Err() != nil {
					break
				}
				if mid != nil && i == at {
					go mid()
				}
				sku := names[i%int64(len(names))]
				t0 := time.Now()
				var err error
				if i%5 == 0 {
					_, err = inv.Stock(ctx, &pb.StockRequest{Sku: sku})
				} else {
					id := fmt.Sprintf("%s-%d", phase, i)
					var reply *pb.DeductReply
					reply, err = inv.Deduct(ctx, &pb.DeductRequest{Sku: sku, Count: 1, RequestId: id})
					if err == nil && !reply.GetDuplicate() {
						local.units++
					}
					if err == nil && i%10 == 1 { // a retry of the same id must not deduct again
						local.calls++
						local.repeats++
						reply, err = inv.Deduct(ctx, &pb.DeductRequest{Sku: sku, Count: 1, RequestId: id})
						if err == nil && !reply.GetDuplicate() {
							err = fmt.Errorf("request id %s deducted twice", id)
						}
					}
				}
				local.latencies = append(local.latencies, time.Since(t0))
				local.calls++
				if err != nil {
					local.failed++
					if local.firstErr == nil {
						local.firstErr = err
					}
				}
			}
			mu.Lock()
			res.calls += local.calls
			res.failed += local.failed
			res.units += local.units
			res.repeats += local.repeats
			res.latencies = append(res.latencies, local.latencies...)
			if res.firstErr == nil {
				res.firstErr = local.firstErr
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	res.elapsed = time.Since(start)
	return res
}

// runServer serves one instance until interrupted, publishing it when a
// registry is given.
func runServer(ctx context.Context, w io.Writer, cfg config) error {
	var reg registry.Registry
	if cfg.registry != "" {
		r, err := registry.Open(ctx, cfg.registry)
		if err != nil {
			return err
		}
		defer r.Close()
		reg = r
	}
	var opts []dabb.Option
	if reg != nil {
		opts = append(opts, dabb.WithRegistry(reg))
	}
	if cfg.token != "" {
		opts = append(opts, dabb.WithInterceptor(dabb.RequireToken(cfg.token)))
	}
	srv := dabb.NewServer(opts...)
	store := inventory.NewStore(skus)
	if err := inventory.RegisterInventoryServer(srv, store); err != nil {
		return err
	}
	names := inventory.InventoryServiceName
	if isDubboRegistry(cfg.registry) {
		if err := registerJava(srv, store); err != nil {
			return err
		}
		names += " and " + InventoryServiceJavaInterface + " (Dubbo, hessian2)"
	}
	l, err := net.Listen("tcp", cfg.addr)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "serving %s on %s (Ctrl-C to stop)\n", names, l.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(l) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = srv.Shutdown(sctx)
	<-done
	calls, deducted, dups := store.Stats()
	fmt.Fprintf(w, "stopped: served %d calls, deducted %d units, %d repeated request ids\n", calls, deducted, dups)
	return err
}

// runClient runs the workload against the instances the registry lists.
func runClient(ctx context.Context, w io.Writer, cfg config) error {
	if cfg.registry == "" {
		return errors.New("client mode needs -registry (e.g. static://127.0.0.1:20880)")
	}
	reg, err := registry.Open(ctx, cfg.registry)
	if err != nil {
		return err
	}
	defer reg.Close()
	// The first lookup of a service waits for the registry within the
	// first call's budget: keep that wait below Stock's 200 ms timeout.
	client, err := proxy.NewClient(reg, proxy.WithCache(registry.CacheConfig{InitialTimeout: 100 * time.Millisecond}))
	if err != nil {
		return err
	}
	defer client.Close()
	inv := inventory.NewInventoryClient(client)
	res := runWorkload(ctx, inv, cfg, fmt.Sprintf("c%d", time.Now().UnixNano()), 0, nil)
	res.print(w, "client")
	if res.failed > 0 {
		return fmt.Errorf("%d calls failed", res.failed)
	}
	return nil
}
