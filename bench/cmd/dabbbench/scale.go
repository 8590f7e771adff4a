package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"

	"github.com/dabbrpc/dabb/bench/frameworks"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
	"github.com/dabbrpc/dabb/bench/scale"
	"github.com/dabbrpc/dabb/protocol"
)

// The scale section: what each resource costs as the work grows. Three
// parts, run after the sweep (and the allocation benchmarks) with -scale:
// idle connections held by dabb's and gRPC-Go's servers, instances of one
// service watched in etcd and ZooKeeper, and calls/s by payload size.

// scaleConfig sizes the scale section.
type scaleConfig struct {
	conns     []int         // idle connections at which the server is measured, increasing; the last is opened as one storm
	dialers   int           // concurrent dialers of the storm
	payloads  []int         // request sizes in bytes
	payloadC  int           // calling goroutines at every payload size
	warmup    time.Duration // of each payload window
	duration  time.Duration // of each payload window
	instances []int         // instance counts of the registry part
	changes   int           // single registrations timed per count
}

// defaultScale is the full scale section: about 3 minutes here.
func defaultScale() scaleConfig {
	return scaleConfig{
		conns:     []int{1, 1000, 10000},
		dialers:   128,
		payloads:  []int{64, 1 << 10, 16 << 10, 256 << 10, 1 << 20},
		payloadC:  16,
		warmup:    500 * time.Millisecond,
		duration:  2 * time.Second,
		instances: []int{10, 1000, 5000},
		changes:   40,
	}
}

// connPoint is one server at one count of idle connections.
type connPoint struct {
	Framework  string
	Conns      int
	RSSKiB     int64
	Goroutines int
	HeapBytes  int64
}

// stormPoint is the storm of one framework: Conns connections opened by
// concurrent dialers, each set up.
type stormPoint struct {
	Framework string
	Conns     int
	Failed    int
	Took      time.Duration
	FirstErr  string
}

// payloadPoint is one framework at one request size.
type payloadPoint struct {
	Framework string
	Size      int
	point
}

// scaleResults is what the scale section measured; errs says what it
// could not.
type scaleResults struct {
	cfg      scaleConfig
	conns    []connPoint
	storms   []stormPoint
	payload  []payloadPoint
	registry []scale.Point
	regCmd   string
	errs     []string
}

// connFrameworks are the servers of the connections part.
var connFrameworks = []string{"dabb", "grpc"}

// payloadFrameworks are those of the payload part.
var payloadFrameworks = []string{"dabb", "raw", "grpc"}

// runScale runs the three parts of the scale section. A part that fails
// leaves its error in errs; the others run all the same.
func runScale(sc scaleConfig, prog *progress, log io.Writer) *scaleResults {
	res := &scaleResults{cfg: sc}
	for _, name := range connFrameworks {
		prog.logf("scale: %s server with %v idle connections", name, sc.conns)
		if err := measureConns(res, name, sc, log); err != nil {
			res.errs = append(res.errs, fmt.Sprintf("connections, %s: %v", name, err))
			prog.logf("scale: connections, %s: %v", name, err)
		}
	}
	prog.logf("scale: instances %v in etcd and ZooKeeper, %d changes each", sc.instances, sc.changes)
	if err := measureRegistries(res, sc); err != nil {
		res.errs = append(res.errs, fmt.Sprintf("instances: %v", err))
		prog.logf("scale: instances: %v", err)
	}
	prog.logf("scale: payloads %v at c=%d", sc.payloads, sc.payloadC)
	if err := measurePayloads(res, sc, prog, log); err != nil {
		res.errs = append(res.errs, fmt.Sprintf("payload: %v", err))
		prog.logf("scale: payload: %v", err)
	}
	return res
}

// memSample is what a server process reported of its memory.
type memSample struct {
	rssKiB     int64
	goroutines int
	heap       int64
}

// takeMem collects garbage, returns the freed pages to the system and
// reports this process's VmRSS in KiB, its goroutines and its live heap.
func takeMem() string {
	runtime.GC()
	debug.FreeOSMemory()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return fmt.Sprintf("%d %d %d", vmRSS(), runtime.NumGoroutine(), ms.HeapAlloc)
}

// vmRSS returns VmRSS from /proc/self/status in KiB, or 0.
func vmRSS() int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return n
		}
	}
	return 0
}

// mem asks the server for its memory.
func (c *child) mem() (memSample, error) {
	if _, err := io.WriteString(c.in, "mem\n"); err != nil {
		return memSample{}, fmt.Errorf("%w: %w", errServerGone, err)
	}
	line, err := c.next()
	if err != nil {
		return memSample{}, err
	}
	v, ok := strings.CutPrefix(line, "mem ")
	f := strings.Fields(v)
	if !ok || len(f) != 3 {
		return memSample{}, fmt.Errorf("dabbbench: server answered %q to mem", line)
	}
	var m memSample
	var err1, err2, err3 error
	m.rssKiB, err1 = strconv.ParseInt(f[0], 10, 64)
	m.goroutines, err2 = strconv.Atoi(f[1])
	m.heap, err3 = strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil {
		return memSample{}, fmt.Errorf("dabbbench: mem %q: %w", v, err)
	}
	return m, nil
}

// idleConn opens a connection to addr that the framework's server has set
// up, and leaves it idle: no goroutine of this process reads it.
type idleConn func(addr string) (net.Conn, error)

// idleDialers: dabb's connection has exchanged a heartbeat; gRPC's the
// HTTP/2 preface and SETTINGS, both ways, acknowledged.
var idleDialers = map[string]idleConn{"dabb": dabbIdle, "grpc": grpcIdle}

// connSetupTimeout bounds the setting up of one idle connection.
const connSetupTimeout = 10 * time.Second

// dabbIdle sends a heartbeat request and reads its answer.
func dabbIdle(addr string) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, connSetupTimeout)
	if err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Now().Add(connSetupTimeout))
	if _, err := nc.Write(protocol.AppendHeartbeat(nil, 1)); err != nil {
		nc.Close()
		return nil, err
	}
	var hdr protocol.Header
	if _, err := io.ReadFull(nc, hdr[:]); err != nil {
		nc.Close()
		return nil, fmt.Errorf("heartbeat answer: %w", err)
	}
	body := hdr.BodyLen()
	if binary.BigEndian.Uint16(hdr[:2]) != protocol.Magic || body > 64 || !hdr.Flags().IsEvent() || hdr.Flags().IsRequest() {
		nc.Close()
		return nil, fmt.Errorf("heartbeat answer: header % x is no heartbeat answer", hdr)
	}
	if _, err := io.CopyN(io.Discard, nc, int64(body)); err != nil {
		nc.Close()
		return nil, fmt.Errorf("heartbeat answer: %w", err)
	}
	nc.SetDeadline(time.Time{})
	return nc, nil
}

// grpcIdle sends the HTTP/2 client preface and SETTINGS and reads until
// the server's SETTINGS (acknowledged) and the acknowledgement of ours.
func grpcIdle(addr string) (net.Conn, error) {
	nc, err := net.DialTimeout("tcp", addr, connSetupTimeout)
	if err != nil {
		return nil, err
	}
	nc.SetDeadline(time.Now().Add(connSetupTimeout))
	fail := func(err error) (net.Conn, error) { nc.Close(); return nil, fmt.Errorf("http/2 setup: %w", err) }
	bw := bufio.NewWriter(nc)
	if _, err := bw.WriteString(http2.ClientPreface); err != nil {
		return fail(err)
	}
	fr := http2.NewFramer(bw, nc)
	if err := fr.WriteSettings(); err != nil {
		return fail(err)
	}
	if err := bw.Flush(); err != nil {
		return fail(err)
	}
	var theirs, acked bool
	for !theirs || !acked {
		f, err := fr.ReadFrame()
		if err != nil {
			return fail(err)
		}
		s, ok := f.(*http2.SettingsFrame)
		if !ok {
			continue // WINDOW_UPDATE, PING
		}
		if s.IsAck() {
			acked = true
			continue
		}
		theirs = true
		if err := fr.WriteSettingsAck(); err != nil {
			return fail(err)
		}
		if err := bw.Flush(); err != nil {
			return fail(err)
		}
	}
	nc.SetDeadline(time.Time{})
	return nc, nil
}

// openConns opens n idle connections with up to dialers at once and
// returns them, the number that failed and the first error.
func openConns(dial idleConn, addr string, n, dialers int) ([]net.Conn, int, error) {
	conns := make([]net.Conn, n)
	var next atomic.Int64
	var failed atomic.Int64
	var once sync.Once
	var first error
	var wg sync.WaitGroup
	for range min(dialers, n) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				c, err := dial(addr)
				if err != nil {
					failed.Add(1)
					once.Do(func() { first = err })
					continue
				}
				conns[i] = c
			}
		}()
	}
	wg.Wait()
	out := conns[:0]
	for _, c := range conns {
		if c != nil {
			out = append(out, c)
		}
	}
	return out, int(failed.Load()), first
}

func closeAll(conns []net.Conn) {
	for _, c := range conns {
		c.Close()
	}
}

// measureConns starts the server of the framework called name in its own
// process, opens idle connections up to each count of sc.conns but the
// last, measuring the server at each, closes them, waits for the server
// to let them go, and opens the last count as one storm, timed, measuring
// the server after it.
func measureConns(res *scaleResults, name string, sc scaleConfig, log io.Writer) error {
	f, err := frameworks.Lookup(name)
	if err != nil {
		return err
	}
	dial := idleDialers[name]
	ch, err := startChild(f, "", log)
	if err != nil {
		return err
	}
	defer ch.stop()
	base, err := ch.mem()
	if err != nil {
		return err
	}
	record := func(n int) error {
		m, err := ch.mem()
		if err != nil {
			return err
		}
		res.conns = append(res.conns, connPoint{Framework: name, Conns: n, RSSKiB: m.rssKiB, Goroutines: m.goroutines, HeapBytes: m.heap})
		return nil
	}
	var conns []net.Conn
	defer func() { closeAll(conns) }()
	steps, storm := sc.conns[:len(sc.conns)-1], sc.conns[len(sc.conns)-1]
	for _, n := range steps {
		more, failed, err := openConns(dial, ch.addr, n-len(conns), sc.dialers)
		conns = append(conns, more...)
		if failed > 0 {
			return fmt.Errorf("%d of %d connections failed: %w", failed, n, err)
		}
		if err := record(n); err != nil {
			return err
		}
	}
	closeAll(conns)
	conns = nil
	// The server lets the closed connections go before the storm: its
	// goroutines come back to what they were with none.
	for deadline := time.Now().Add(10 * time.Second); ; {
		m, err := ch.mem()
		if err != nil {
			return err
		}
		if m.goroutines <= base.goroutines+2 {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the server still had %d goroutines (%d with no connection) 10 s after the connections closed", m.goroutines, base.goroutines)
		}
		time.Sleep(50 * time.Millisecond) // polling another process's count: nothing to await
	}
	t0 := time.Now()
	conns, failed, err := openConns(dial, ch.addr, storm, sc.dialers)
	sp := stormPoint{Framework: name, Conns: storm, Failed: failed, Took: time.Since(t0)}
	if err != nil {
		sp.FirstErr = err.Error()
	}
	res.storms = append(res.storms, sp)
	return record(len(conns))
}

// perConnKiB returns the server's RSS per connection of a framework:
// (RSS at the most connections − RSS at the fewest) ÷ the difference.
func (r *scaleResults) perConnKiB(name string) (float64, bool) {
	var lo, hi *connPoint
	for i := range r.conns {
		p := &r.conns[i]
		if p.Framework != name {
			continue
		}
		if lo == nil || p.Conns < lo.Conns {
			lo = p
		}
		if hi == nil || p.Conns > hi.Conns {
			hi = p
		}
	}
	if lo == nil || hi.Conns == lo.Conns {
		return 0, false
	}
	return float64(hi.RSSKiB-lo.RSSKiB) / float64(hi.Conns-lo.Conns), true
}

// registryTimeout bounds the go test run of the registry part.
const registryTimeout = 6 * time.Minute

// measureRegistries runs TestRegistryScale of the bench module's scale
// package, which starts etcd and ZooKeeper, and reads the points it
// writes.
func measureRegistries(res *scaleResults, sc scaleConfig) error {
	sizes := make([]string, len(sc.instances))
	for i, n := range sc.instances {
		sizes[i] = strconv.Itoa(n)
	}
	res.regCmd = fmt.Sprintf("%s=%s %s=%d go test -run '^TestRegistryScale$' -count 1 -v ./scale",
		scale.SizesEnv, strings.Join(sizes, ","), scale.ChangesEnv, sc.changes)
	wd, err := os.Getwd()
	if err != nil {
		return err
	}
	dir, err := findBenchModule(wd)
	if err != nil {
		return err
	}
	goTool, err := exec.LookPath("go")
	if err != nil {
		return err
	}
	tmp, err := os.MkdirTemp("", "dabbbench-scale")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	out := filepath.Join(tmp, "registry.json")
	ctx, cancel := context.WithTimeout(context.Background(), registryTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "test", "-run", "^TestRegistryScale$", "-count", "1", "-v", "./scale")
	cmd.Dir = dir
	cmd.WaitDelay = 5 * time.Second
	cmd.Env = append(os.Environ(), scale.SizesEnv+"="+strings.Join(sizes, ","),
		scale.ChangesEnv+"="+strconv.Itoa(sc.changes), scale.OutEnv+"="+out)
	text, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("go test in %s: %w%s", dir, err, lastLines(string(text), 12))
	}
	res.registry, err = readRegistryPoints(out, text)
	return err
}

// readRegistryPoints reads the points TestRegistryScale wrote to out.
// text is the test's output, shown when it wrote none.
func readRegistryPoints(out string, text []byte) ([]scale.Point, error) {
	pts, err := scale.ReadJSON(out)
	if errors.Is(err, fs.ErrNotExist) {
		// The test skips when etcd or ZooKeeper is not installed, and
		// then writes nothing.
		return nil, fmt.Errorf("TestRegistryScale wrote no points (etcd and ZooKeeper must be installed; scripts/test.sh installs them)%s",
			lastLines(string(text), 12))
	}
	return pts, err
}

// newRequest returns the request of size bytes marshaled: the standard
// message, padded, from StandardSize + 4 up; below that only field1 and
// field2 set (what the reply check needs) and padding, so a 64-byte
// request is 64 bytes; size 0 is the standard message.
func newRequest(size int) *benchpb.BenchmarkMessage {
	if size == 0 || size >= benchpb.StandardSize+4 {
		return benchpb.NewMessage(size)
	}
	m := &benchpb.BenchmarkMessage{Field1: "x", Field2: 1}
	for n := 0; ; n++ {
		m.Padding = make([]byte, n)
		if s := benchpb.Size(m); s >= size || n > size {
			return m
		}
	}
}

// measurePayloads measures dabb, raw and gRPC at every payload size, at
// sc.payloadC goroutines, one window each, the frameworks interleaved (the
// order rotated by size).
func measurePayloads(res *scaleResults, sc scaleConfig, prog *progress, log io.Writer) error {
	var ents []*entrant
	defer func() {
		for _, e := range ents {
			e.close()
		}
	}()
	for _, name := range payloadFrameworks {
		f, err := frameworks.Lookup(name)
		if err != nil {
			return err
		}
		e, err := startEntrant(f, config{}, log)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		ents = append(ents, e)
	}
	for i, size := range sc.payloads {
		for _, j := range rotation(i, len(ents)) {
			e := ents[j]
			settle(ents)
			s := spec{label: sizeLabel(size), payload: sizeLabel(size), size: size, c: sc.payloadC}
			p, err := measure(e.client, e.ch, s, sc.warmup, sc.duration)
			if err != nil {
				return fmt.Errorf("%s at %s: %w", e.f.Name, s.label, err)
			}
			p.Framework = e.f.Name
			res.payload = append(res.payload, payloadPoint{Framework: e.f.Name, Size: size, point: p})
			prog.logf("scale: %-5s %8s %9.0f calls/s  p99 %v", e.f.Name, s.label, p.rate(), round(p.P99))
		}
	}
	return nil
}

// sizeLabel names a size: 64 B, 16 KiB, 1 MiB.
func sizeLabel(n int) string {
	switch {
	case n >= 1<<20 && n%(1<<20) == 0:
		return fmt.Sprintf("%d MiB", n>>20)
	case n >= 1<<10 && n%(1<<10) == 0:
		return fmt.Sprintf("%d KiB", n>>10)
	}
	return fmt.Sprintf("%d B", n)
}

// findPayload returns the point of framework at size.
func (r *scaleResults) findPayload(name string, size int) (payloadPoint, bool) {
	for _, p := range r.payload {
		if p.Framework == name && p.Size == size {
			return p, true
		}
	}
	return payloadPoint{}, false
}

// writeScale writes the scale section's tables.
func writeScale(w io.Writer, r *scaleResults) {
	if r == nil {
		return
	}
	sc := r.cfg
	fmt.Fprintln(w, "\n### Scale: what each resource costs as the work grows")
	fmt.Fprintln(w)
	fmt.Fprintf(w, "Idle connections (dabb: each has exchanged a heartbeat; gRPC: the HTTP/2 preface and SETTINGS, both acknowledged). "+
		"Server process after a GC and returning freed pages; %d connections opened one step after the other, then closed, "+
		"then %d opened at once by %d dialers (the storm):\n\n", sc.conns[len(sc.conns)-2], sc.conns[len(sc.conns)-1], sc.dialers)
	fmt.Fprint(w, "| server |")
	for _, n := range sc.conns {
		fmt.Fprintf(w, " RSS, %d conns |", n)
	}
	for _, n := range sc.conns {
		fmt.Fprintf(w, " goroutines, %d |", n)
	}
	fmt.Fprintln(w, " KiB per connection | storm of connects |")
	fmt.Fprint(w, "|---|")
	for range 2*len(sc.conns) + 2 {
		fmt.Fprint(w, "---:|")
	}
	fmt.Fprintln(w)
	for _, name := range connFrameworks {
		fmt.Fprintf(w, "| %s |", name)
		byN := map[int]connPoint{}
		for _, p := range r.conns {
			if p.Framework == name {
				byN[p.Conns] = p
			}
		}
		for _, n := range sc.conns {
			if p, ok := byN[n]; ok {
				fmt.Fprintf(w, " %.1f MiB |", float64(p.RSSKiB)/1024)
			} else {
				fmt.Fprint(w, " - |")
			}
		}
		for _, n := range sc.conns {
			if p, ok := byN[n]; ok {
				fmt.Fprintf(w, " %d |", p.Goroutines)
			} else {
				fmt.Fprint(w, " - |")
			}
		}
		if k, ok := r.perConnKiB(name); ok {
			fmt.Fprintf(w, " %.1f |", k)
		} else {
			fmt.Fprint(w, " - |")
		}
		storm := "-"
		for _, s := range r.storms {
			if s.Framework == name {
				storm = fmtDur(s.Took)
				if s.Failed > 0 {
					storm += fmt.Sprintf(" (%d failed: %s)", s.Failed, s.FirstErr)
				}
			}
		}
		fmt.Fprintf(w, " %s |\n", storm)
	}
	if d, ok1 := r.perConnKiB("dabb"); ok1 {
		if g, ok2 := r.perConnKiB("grpc"); ok2 && g > 0 {
			fmt.Fprintf(w, "\nKiB per connection = (RSS at %d − RSS at %d) ÷ %d; dabb ÷ gRPC-Go: %.2f (target ≤ 0.5).\n",
				sc.conns[len(sc.conns)-1], sc.conns[0], sc.conns[len(sc.conns)-1]-sc.conns[0], d/g)
		}
	}

	fmt.Fprintf(w, "\nInstances of one service, registered by another process; the client is a `registry.Cache` feeding a balancer, "+
		"as `proxy.Client` is (`cd bench && %s`). Cache memory: the client's live heap with the service watched minus without; "+
		"registration → pick: from the start of one more instance's registration to the balancer's `Update` holding it, over %d registrations; "+
		"CPU: the client process's over them, per change:\n\n", r.regCmd, sc.changes)
	fmt.Fprintln(w, "| registry | instances | cache memory | per instance | first list | registration → pick p50 | p99 | max | client CPU per change |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, p := range r.registry {
		mem, per := fmt.Sprintf("%.0f KiB", float64(p.CacheBytes)/1024), fmt.Sprintf("%.0f B", float64(p.CacheBytes)/float64(p.Instances))
		if p.CacheBytes <= 0 {
			// The registry client's own allocations move the heap by
			// tens of KiB: a few instances weigh less than that.
			mem, per = "below the noise", "-"
		}
		fmt.Fprintf(w, "| %s | %d | %s | %s | %s | %s | %s | %s | %s |\n", p.Backend, p.Instances,
			mem, per, fmtDur(p.FirstList),
			fmtDur(p.P50), fmtDur(p.P99), fmtDur(p.Max), fmtDur(p.CPUPerChange))
	}

	fmt.Fprintf(w, "\nPayload: calls/s and p99 at c=%d, one %v window (%v warm-up) per size and framework, interleaved:\n\n", sc.payloadC, sc.duration, sc.warmup)
	fmt.Fprintln(w, "| request | dabb calls/s | raw | grpc | dabb ÷ raw | dabb ÷ grpc | dabb p99 | raw p99 | grpc p99 |")
	fmt.Fprintln(w, "|---|---:|---:|---:|---:|---:|---:|---:|---:|")
	for _, size := range sc.payloads {
		d, ok1 := r.findPayload("dabb", size)
		rw, ok2 := r.findPayload("raw", size)
		g, ok3 := r.findPayload("grpc", size)
		if !ok1 || !ok2 || !ok3 {
			continue
		}
		ratio := func(a, b payloadPoint) string {
			if b.rate() == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2f", a.rate()/b.rate())
		}
		fmt.Fprintf(w, "| %s | %.0f | %.0f | %.0f | %s | %s | %s | %s | %s |\n", sizeLabel(size), d.rate(), rw.rate(), g.rate(),
			ratio(d, rw), ratio(d, g), fmtDur(d.P99), fmtDur(rw.P99), fmtDur(g.P99))
	}
	var errs []string
	for _, p := range r.payload {
		if p.Errors > 0 {
			errs = append(errs, fmt.Sprintf("- payload %s, %s: %d errors, first: %s", sizeLabel(p.Size), p.Framework, p.Errors, p.FirstErr))
		}
	}
	for _, e := range r.errs {
		errs = append(errs, "- "+e)
	}
	if len(errs) > 0 {
		fmt.Fprintln(w, "\nScale errors:")
		fmt.Fprintln(w)
		fmt.Fprintln(w, strings.Join(errs, "\n"))
	}
}

// scaleFile is the machine-readable scale section, in -out.
const scaleFile = "scale.json"

// scaleJSON is the content of scale.json.
func (r *scaleResults) scaleJSON() ([]byte, error) {
	type payload struct {
		Framework string  `json:"framework"`
		Size      int     `json:"size"`
		CallsPerS float64 `json:"calls_per_s"`
		P50us     float64 `json:"p50_us"`
		P99us     float64 `json:"p99_us"`
		Errors    uint64  `json:"errors"`
	}
	v := struct {
		Conns    []connPoint   `json:"conns"`
		Storms   []stormPoint  `json:"storms"`
		Payload  []payload     `json:"payload"`
		Registry []scale.Point `json:"registry"`
		Errors   []string      `json:"errors"`
	}{Conns: r.conns, Storms: r.storms, Registry: r.registry, Errors: r.errs}
	for _, p := range r.payload {
		v.Payload = append(v.Payload, payload{p.Framework, p.Size, p.rate(), float64(p.P50) / 1e3, float64(p.P99) / 1e3, p.Errors})
	}
	return json.MarshalIndent(v, "", "  ")
}

// writeScaleOnly writes the scale section of a run without the sweep
// (-sweep=false) to stdout and to scale.md and scale.json in -out.
func writeScaleOnly(res *results, stdout io.Writer) error {
	if err := os.MkdirAll(res.cfg.out, 0o755); err != nil {
		return fmt.Errorf("dabbbench: results: %w", err)
	}
	var md strings.Builder
	fmt.Fprintf(&md, "## dabbbench: the scale section alone\n\nCommand: `cd bench && go run ./cmd/dabbbench %s`  \n", strings.Join(res.cfg.args, " "))
	fmt.Fprintf(&md, "Run %s, %v; %s, %d CPUs, %s/%s, %s; load average %s before, %s after.\n",
		res.start.Format("2006-01-02 15:04 MST"), res.end.Sub(res.start).Round(time.Second), cpuModel(),
		runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version(), res.loadFrom, res.loadTo)
	writeScale(&md, res.scale)
	if _, err := io.WriteString(stdout, md.String()); err != nil {
		return err
	}
	js, err := res.scale.scaleJSON()
	if err != nil {
		return err
	}
	for name, data := range map[string][]byte{"scale.md": []byte(md.String()), scaleFile: js} {
		if err := writeFile(filepath.Join(res.cfg.out, name), func(w io.Writer) error { _, err := w.Write(data); return err }); err != nil {
			return err
		}
	}
	fmt.Fprintf(stdout, "\nwritten: %s\n", filepath.Join(res.cfg.out, "scale.{md,json}"))
	return nil
}
