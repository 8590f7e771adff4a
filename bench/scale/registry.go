// Package scale measures what a registry's instances cost a watching
// client as their number grows: the memory of its cache, the time from an
// instance's registration to the moment the client's balancer holds it,
// and the client's CPU per change.
//
// The instances are registered by a registrar in another process (see
// [StartRegistrar]), so the client process's CPU and heap are the
// client's alone. TestRegistryScale runs it against real etcd and
// ZooKeeper servers; cmd/dabbbench runs that test and reads its results.
package scale

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/etcd"
	"github.com/dabbrpc/dabb/registry/zk"
)

// Environment of the registrar process and of the test that dabbbench
// runs.
const (
	// RoleEnv set to "registrar" makes the test binary a registrar.
	RoleEnv = "DABBBENCH_SCALE_ROLE"
	// BackendEnv names the registrar's backend: etcd or zk.
	BackendEnv = "DABBBENCH_SCALE_BACKEND"
	// AddrEnv is the registrar's server address, host:port.
	AddrEnv = "DABBBENCH_SCALE_ADDR"
	// SizesEnv lists the instance counts TestRegistryScale measures,
	// comma-separated; default "10".
	SizesEnv = "DABBBENCH_SCALE_SIZES"
	// ChangesEnv is how many single registrations each size times;
	// default 5.
	ChangesEnv = "DABBBENCH_SCALE_CHANGES"
	// OutEnv names the JSON file TestRegistryScale writes its points to.
	OutEnv = "DABBBENCH_SCALE_OUT"
)

// ErrRegistrar reports a registrar process that failed or went away.
var ErrRegistrar = errors.New("scale: registrar")

// Point is one backend at one instance count.
type Point struct {
	Backend   string `json:"backend"`
	Instances int    `json:"instances"`
	// RegisterAll is how long the registrar took to register them all.
	RegisterAll time.Duration `json:"register_all_ns"`
	// FirstList is the time from the watch's start to the first list in
	// the balancer.
	FirstList time.Duration `json:"first_list_ns"`
	// CacheBytes is the client's live heap with the service watched
	// minus without (after a GC each), the connection to the registry
	// made before.
	CacheBytes int64 `json:"cache_bytes"`
	// Changes is how many single registrations were timed.
	Changes int `json:"changes"`
	// P50 and P99 are of the times from a registration's start to the
	// balancer's Update holding the new instance.
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
	// CPUPerChange is the client process's CPU time (getrusage) over the
	// changes divided by their number.
	CPUPerChange time.Duration `json:"cpu_per_change_ns"`
}

// Backend is a registry the client watches.
type Backend struct {
	Name string // etcd, zk
	Addr string // host:port of the server
}

// open returns a client registry of b.
func (b Backend) open(log *slog.Logger) (registry.Registry, error) {
	switch b.Name {
	case "etcd":
		return etcd.New(etcd.Config{Endpoints: []string{b.Addr}, Logger: log})
	case "zk":
		return zk.New(zk.Config{Servers: []string{b.Addr}, Logger: log})
	}
	return nil, fmt.Errorf("scale: unknown backend %q", b.Name)
}

// Quiet logs warnings and errors only.
func Quiet() *slog.Logger {
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
}

// Registrar is a registrar process: it registers instances on command.
type Registrar struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

// StartRegistrar starts exe (a test binary whose TestMain calls
// [RegistrarMain] when RoleEnv is "registrar") as the registrar of b.
func StartRegistrar(exe string, b Backend) (*Registrar, error) {
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), RoleEnv+"=registrar", BackendEnv+"="+b.Name, AddrEnv+"="+b.Addr)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("%w: start: %w", ErrRegistrar, err)
	}
	return &Registrar{cmd: cmd, in: in, out: bufio.NewScanner(out)}, nil
}

// send writes one command line.
func (r *Registrar) send(line string) error {
	if _, err := io.WriteString(r.in, line+"\n"); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrRegistrar, line, err)
	}
	return nil
}

// reply reads the answer to a command: "ok" or "error ...".
func (r *Registrar) reply() error {
	if !r.out.Scan() {
		return fmt.Errorf("%w: exited: %v", ErrRegistrar, r.out.Err())
	}
	line := r.out.Text()
	if line != "ok" {
		return fmt.Errorf("%w: %s", ErrRegistrar, line)
	}
	return nil
}

// Close ends the registrar, which deregisters its instances.
func (r *Registrar) Close() error {
	r.in.Close()
	return r.cmd.Wait()
}

// RegistrarMain runs the registrar process: it reads "bulk SERVICE N"
// (register instances b-00000 ... of SERVICE, concurrently) and "add
// SERVICE ID" (register one), answering "ok" or "error ..." to each, and
// exits when stdin closes.
func RegistrarMain(stdin io.Reader, stdout io.Writer) error {
	b := Backend{Name: os.Getenv(BackendEnv), Addr: os.Getenv(AddrEnv)}
	// ZooKeeper registrations of one Registry take turns: several
	// sessions register in parallel.
	regs := make([]registry.Registry, 16)
	for i := range regs {
		r, err := b.open(Quiet())
		if err != nil {
			return err
		}
		defer r.Close()
		regs[i] = r
	}
	ctx := context.Background()
	sc := bufio.NewScanner(stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		var err error
		switch {
		case len(f) == 3 && f[0] == "bulk":
			n, perr := strconv.Atoi(f[2])
			if perr != nil {
				err = perr
				break
			}
			err = bulk(ctx, regs, f[1], n)
		case len(f) == 3 && f[0] == "add":
			err = regs[0].Register(ctx, instance(f[1], f[2]))
		default:
			err = fmt.Errorf("unknown command %q", sc.Text())
		}
		if err != nil {
			fmt.Fprintf(stdout, "error %v\n", err)
			continue
		}
		fmt.Fprintln(stdout, "ok")
	}
	return sc.Err()
}

// instance is the instance called id of service, at an address no one
// dials: only the client's cache and balancer see it.
func instance(service, id string) registry.Instance {
	h := 0
	for _, c := range id {
		h = h*31 + int(c)
	}
	h &= 0xffffff
	return registry.Instance{Service: service, ID: id,
		Addr: fmt.Sprintf("10.%d.%d.%d:8080", h>>16, (h>>8)&0xff, h&0xff), Metadata: map[string]string{"zone": "z1"}}
}

// bulk registers n instances of service, b-00000 on, spread over regs.
func bulk(ctx context.Context, regs []registry.Registry, service string, n int) error {
	var wg sync.WaitGroup
	errs := make([]error, len(regs))
	for w := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += len(regs) {
				if err := regs[w].Register(ctx, instance(service, fmt.Sprintf("b-%05d", i))); err != nil {
					errs[w] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// Measure registers n instances of a service of its own with reg, then
// watches it from a client of b as a dabb client does (a registry.Cache
// feeding a balancer), measures the cache's heap, and times changes
// single registrations.
func Measure(b Backend, reg *Registrar, n, changes int) (Point, error) {
	p := Point{Backend: b.Name, Instances: n, Changes: changes}
	service := fmt.Sprintf("scale.S%d", n)
	t0 := time.Now()
	if err := reg.send(fmt.Sprintf("bulk %s %d", service, n)); err != nil {
		return p, err
	}
	if err := reg.reply(); err != nil {
		return p, err
	}
	p.RegisterAll = time.Since(t0)

	cli, err := b.open(Quiet())
	if err != nil {
		return p, err
	}
	defer cli.Close()
	cache := registry.NewCache(cli, registry.CacheConfig{Logger: Quiet(), InitialTimeout: 10 * time.Second})
	defer cache.Close()
	// The connection (session) to the registry is made before the
	// baseline: a service of no instances is watched first.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cache.Instances(ctx, "scale.Empty"); err != nil {
		return p, fmt.Errorf("scale: %s: warm-up lookup: %w", b.Name, err)
	}
	before := liveHeap()

	bal, err := balancer.New("", balancer.Config{})
	if err != nil {
		return p, err
	}
	var mu sync.Mutex
	var want string                  // the ID awaited, or ""
	seen := make(chan time.Time, 1)  // when a list holding want reached the balancer
	first := make(chan time.Time, 1) // when the first list of n reached it
	t0 = time.Now()
	unsub, err := cache.Subscribe(service, func(ins []registry.Instance) {
		bal.Update(ins)
		now := time.Now()
		mu.Lock()
		w := want
		mu.Unlock()
		if len(ins) >= n {
			select {
			case first <- now:
			default:
			}
		}
		if w != "" && holds(ins, w) {
			mu.Lock()
			if want == w {
				want = ""
				seen <- now
			}
			mu.Unlock()
		}
	})
	if err != nil {
		return p, err
	}
	defer unsub()
	select {
	case t := <-first:
		p.FirstList = t.Sub(t0)
	case <-time.After(60 * time.Second):
		return p, fmt.Errorf("scale: %s: no list of %d instances within 60 s", b.Name, n)
	}
	p.CacheBytes = int64(liveHeap()) - int64(before)
	runtime.KeepAlive(bal)

	lat := make([]time.Duration, 0, changes)
	cpu0 := CPUTime()
	for i := range changes {
		id := fmt.Sprintf("c-%05d", i)
		mu.Lock()
		want = id
		mu.Unlock()
		start := time.Now()
		if err := reg.send(fmt.Sprintf("add %s %s", service, id)); err != nil {
			return p, err
		}
		select {
		case t := <-seen:
			lat = append(lat, t.Sub(start))
		case <-time.After(10 * time.Second):
			return p, fmt.Errorf("scale: %s: instance %s of %s not in the balancer 10 s after its registration began", b.Name, id, service)
		}
		if err := reg.reply(); err != nil {
			return p, err
		}
	}
	if changes > 0 {
		p.CPUPerChange = (CPUTime() - cpu0) / time.Duration(changes)
		slices.Sort(lat)
		p.P50, p.P99, p.Max = quantile(lat, 0.5), quantile(lat, 0.99), lat[len(lat)-1]
	}
	return p, nil
}

// holds reports whether ins, sorted by ID as a Cache gives it, holds id.
func holds(ins []registry.Instance, id string) bool {
	i := sort.Search(len(ins), func(i int) bool { return ins[i].ID >= id })
	return i < len(ins) && ins[i].ID == id
}

// quantile returns the q-quantile of sorted d (nearest rank).
func quantile(d []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(d))+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// liveHeap returns the heap's live bytes after two collections.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// WriteJSON writes points to path.
func WriteJSON(path string, pts []Point) error {
	b, err := json.MarshalIndent(pts, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, b, 0o644)
}

// ReadJSON reads what WriteJSON wrote.
func ReadJSON(path string) ([]Point, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var pts []Point
	if err := json.Unmarshal(b, &pts); err != nil {
		return nil, fmt.Errorf("scale: %s: %w", path, err)
	}
	return pts, nil
}
