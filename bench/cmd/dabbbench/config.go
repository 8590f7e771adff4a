package main

import (
	"errors"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
)

// ErrUsage reports bad flags.
var ErrUsage = errors.New("dabbbench: usage")

// config is what the flags choose.
type config struct {
	frameworks []frameworks.Framework
	conc       []int
	duration   time.Duration
	warmup     time.Duration
	rounds     int    // every point is measured this many times, frameworks interleaved
	payload    string // small, 16k, 1m
	size       int    // marshaled request size; 0 for the standard message
	mix        bool
	mixC       int
	large      int
	out        string
	profile    string // directory for CPU profiles, or ""
	readme     string // a Markdown file whose dabbbench block gets the table, or ""
	allocs     bool   // also run the in-process benchmarks for allocations per call
	scale      bool   // also run the scale section
	sweep      bool   // run the sweep (false: the scale section alone)
	scaleCfg   scaleConfig
	args       []string
}

// payloads maps -payload values to message sizes.
var payloads = map[string]int{"small": 0, "16k": 16 << 10, "1m": 1 << 20}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("dabbbench", flag.ContinueOnError)
	names := fs.String("frameworks", frameworks.Names(), "comma-separated frameworks to run; "+frameworks.ExtraNames()+" (over TLS 1.3) and "+frameworks.DubboNames()+" (Dubbo's hessian2) run only when named; \"default\" stands for the default list, \"dubbo\" for "+frameworks.DubboNames())
	conc := fs.String("c", "1,16,128,1024", "comma-separated concurrency levels (goroutines sharing one client)")
	duration := fs.Duration("duration", 4*time.Second, "measured window per point")
	warmup := fs.Duration("warmup", time.Second, "warm-up before each window of the first round (half of it, at least 250ms, in later rounds)")
	rounds := fs.Int("rounds", 3, "measure every point this many times, the frameworks interleaved, and report the median round")
	payload := fs.String("payload", "small", "request size: small (581 B), 16k or 1m")
	mix := fs.Bool("mix", true, "also measure small calls while 1 MiB calls share the client")
	mixC := fs.Int("mixc", 16, "small-call goroutines of the -mix point")
	large := fs.Int("large", 2, "1 MiB-call goroutines of the -mix point")
	out := fs.String("out", "results", "directory for the table, CSV and chart")
	readme := fs.String("readme", "", "also put the table into this Markdown file, between <!-- dabbbench:start --> and <!-- dabbbench:end -->")
	allocs := fs.Bool("allocs", true, "after the sweep, also count allocations per call with the in-process benchmarks (go test -bench in the bench module, about 20 s)")
	scaleOn := fs.Bool("scale", true, "after the sweep, also measure the scale section: idle connections of dabb's and gRPC-Go's servers, instances in etcd and ZooKeeper, payload sizes (about 3 minutes)")
	sweep := fs.Bool("sweep", true, "run the concurrency sweep; -sweep=false runs the scale section alone and writes it to scale.md in -out")
	profile := fs.String("cpuprofile", "", "directory to write CPU profiles to: <framework>-server.pprof for each server, and one of the client process, all-client.pprof (<framework>-client.pprof with one framework)")
	fs.Bool("server", false, "run as a framework's server process (used by the command itself)")
	fs.String("framework", "", "with -server: the framework to serve")
	fs.Int("calls", 0, "with -framework and -addr: run as a client alone that makes this many calls, one after the other, to that framework's server at that address (scripts/instructions.sh)")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	cfg := config{duration: *duration, warmup: *warmup, rounds: *rounds, payload: *payload, mix: *mix,
		mixC: *mixC, large: *large, out: *out, profile: *profile, readme: *readme, allocs: *allocs,
		scale: *scaleOn, sweep: *sweep, scaleCfg: defaultScale(), args: args}
	for _, n := range expandGroups(*names) {
		f, err := frameworks.Lookup(n)
		if err != nil {
			return config{}, fmt.Errorf("%w: -frameworks: %w", ErrUsage, err)
		}
		cfg.frameworks = append(cfg.frameworks, f)
	}
	for _, s := range strings.Split(*conc, ",") {
		c, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || c < 1 || c > 100_000 {
			return config{}, fmt.Errorf("%w: -c: %q is not a concurrency between 1 and 100000", ErrUsage, s)
		}
		if slices.Contains(cfg.conc, c) {
			return config{}, fmt.Errorf("%w: -c: %d is given twice", ErrUsage, c)
		}
		cfg.conc = append(cfg.conc, c)
	}
	for i, f := range cfg.frameworks {
		if slices.ContainsFunc(cfg.frameworks[:i], func(g frameworks.Framework) bool { return g.Name == f.Name }) {
			return config{}, fmt.Errorf("%w: -frameworks: %s is given twice", ErrUsage, f.Name)
		}
	}
	size, ok := payloads[cfg.payload]
	switch {
	case !ok:
		return config{}, fmt.Errorf("%w: -payload %q: want small, 16k or 1m", ErrUsage, cfg.payload)
	case cfg.duration <= 0 || cfg.warmup < 0:
		return config{}, fmt.Errorf("%w: -duration must be > 0 and -warmup >= 0", ErrUsage)
	case cfg.rounds < 1 || cfg.rounds > 1000:
		return config{}, fmt.Errorf("%w: -rounds %d: want 1 to 1000", ErrUsage, cfg.rounds)
	case !cfg.sweep && !cfg.scale:
		return config{}, fmt.Errorf("%w: -sweep=false with -scale=false measures nothing", ErrUsage)
	case cfg.mix && (cfg.mixC < 1 || cfg.large < 1):
		return config{}, fmt.Errorf("%w: -mixc and -large must be >= 1", ErrUsage)
	}
	cfg.size = size
	if cfg.payload == "small" {
		cfg.size = 0
	}
	return cfg, nil
}

// expandGroups splits the -frameworks list, with "default" replaced by
// the default frameworks and "dubbo" by the Dubbo ones.
func expandGroups(list string) []string {
	var out []string
	for _, n := range strings.Split(list, ",") {
		switch n = strings.TrimSpace(n); n {
		case "default":
			out = append(out, strings.Split(frameworks.Names(), ",")...)
		case "dubbo":
			out = append(out, strings.Split(frameworks.DubboNames(), ",")...)
		default:
			out = append(out, n)
		}
	}
	return out
}

// spec is one point of the sweep as configured, measured on every
// framework in every round.
type spec struct {
	label   string // c=16, c=16 +2×1MiB
	payload string // small, 16k, 1m
	size    int    // marshaled request size; 0 for the standard message
	c       int    // goroutines making calls of payload
	large   int    // goroutines making 1 MiB calls alongside
}

// specs returns the points of one round in order: each concurrency of -c,
// then, with -mix, the small calls at -mixc alone (unless the sweep has
// that point already) and with the 1 MiB calls.
func (c config) specs() []spec {
	var s []spec
	for _, n := range c.conc {
		s = append(s, spec{label: fmt.Sprintf("c=%d", n), payload: c.payload, size: c.size, c: n})
	}
	if c.mix {
		if c.payload != "small" || !slices.Contains(c.conc, c.mixC) {
			s = append(s, spec{label: fmt.Sprintf("c=%d small", c.mixC), payload: "small", c: c.mixC})
		}
		s = append(s, spec{label: fmt.Sprintf("c=%d +%d×1MiB", c.mixC, c.large), payload: "small", c: c.mixC, large: c.large})
	}
	return s
}

// laterWarmup is the shortest warm-up of a window after the first round.
const laterWarmup = 250 * time.Millisecond

// warmupFor returns the warm-up of the windows of round r (from 0): -warmup
// in the first round; in later ones, whose connections are warm and whose
// goroutine counts each framework has run before, half of it, at least
// 250ms (and never more than -warmup).
func (c config) warmupFor(r int) time.Duration {
	if r == 0 {
		return c.warmup
	}
	return min(c.warmup, max(c.warmup/2, laterWarmup))
}

// windowsLeft returns how many windows one framework has after round r's
// point i (from 0), and how long they take; r = 0, i = -1 is all of them.
func (c config) windowsLeft(r, i int) (int, time.Duration) {
	n, specs := 0, len(c.specs())
	var d time.Duration
	for ; r < c.rounds; r, i = r+1, -1 {
		k := specs - i - 1
		n += k
		d += time.Duration(k) * (c.warmupFor(r) + c.duration)
	}
	return n, d
}

// inProcessNames returns the names of the chosen frameworks that the
// in-process benchmarks can run: not those with a program of their own.
func (c config) inProcessNames() []string {
	var names []string
	for _, f := range c.frameworks {
		if f.Program == "" {
			names = append(names, f.Name)
		}
	}
	return names
}

// frameworkNames returns the names of the chosen frameworks.
func (c config) frameworkNames() []string {
	names := make([]string, len(c.frameworks))
	for i, f := range c.frameworks {
		names[i] = f.Name
	}
	return names
}
