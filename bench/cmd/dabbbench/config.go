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
	payload    string // small, 16k, 1m
	size       int    // marshaled request size; 0 for the standard message
	mix        bool
	mixC       int
	large      int
	out        string
	profile    string // directory for CPU profiles, or ""
	readme     string // a Markdown file whose dabbbench block gets the table, or ""
	allocs     bool   // also run the in-process benchmarks for allocations per call
	args       []string
}

// payloads maps -payload values to message sizes.
var payloads = map[string]int{"small": 0, "16k": 16 << 10, "1m": 1 << 20}

func parseFlags(args []string) (config, error) {
	fs := flag.NewFlagSet("dabbbench", flag.ContinueOnError)
	names := fs.String("frameworks", frameworks.Names(), "comma-separated frameworks to run")
	conc := fs.String("c", "1,16,128,1024", "comma-separated concurrency levels (goroutines sharing one client)")
	duration := fs.Duration("duration", 4*time.Second, "measured window per point")
	warmup := fs.Duration("warmup", time.Second, "warm-up before each point's window")
	payload := fs.String("payload", "small", "request size: small (581 B), 16k or 1m")
	mix := fs.Bool("mix", true, "also measure small calls while 1 MiB calls share the client")
	mixC := fs.Int("mixc", 16, "small-call goroutines of the -mix point")
	large := fs.Int("large", 2, "1 MiB-call goroutines of the -mix point")
	out := fs.String("out", "results", "directory for the table, CSV and chart")
	readme := fs.String("readme", "", "also put the table into this Markdown file, between <!-- dabbbench:start --> and <!-- dabbbench:end -->")
	allocs := fs.Bool("allocs", true, "after the sweep, also count allocations per call with the in-process benchmarks (go test -bench in the bench module, about 20 s)")
	profile := fs.String("cpuprofile", "", "directory to write CPU profiles to: <framework>-client.pprof and <framework>-server.pprof")
	fs.Bool("server", false, "run as a framework's server process (used by the command itself)")
	fs.String("framework", "", "with -server: the framework to serve")
	if err := fs.Parse(args); err != nil {
		return config{}, err
	}
	if fs.NArg() > 0 {
		return config{}, fmt.Errorf("%w: unexpected arguments %q", ErrUsage, fs.Args())
	}
	cfg := config{duration: *duration, warmup: *warmup, payload: *payload, mix: *mix,
		mixC: *mixC, large: *large, out: *out, profile: *profile, readme: *readme, allocs: *allocs, args: args}
	for _, n := range strings.Split(*names, ",") {
		f, err := frameworks.Lookup(strings.TrimSpace(n))
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
		cfg.conc = append(cfg.conc, c)
	}
	size, ok := payloads[cfg.payload]
	switch {
	case !ok:
		return config{}, fmt.Errorf("%w: -payload %q: want small, 16k or 1m", ErrUsage, cfg.payload)
	case cfg.duration <= 0 || cfg.warmup < 0:
		return config{}, fmt.Errorf("%w: -duration must be > 0 and -warmup >= 0", ErrUsage)
	case cfg.mix && (cfg.mixC < 1 || cfg.large < 1):
		return config{}, fmt.Errorf("%w: -mixc and -large must be >= 1", ErrUsage)
	}
	cfg.size = size
	if cfg.payload == "small" {
		cfg.size = 0
	}
	return cfg, nil
}

// points returns the number of measured points the run will make.
func (c config) points() int {
	n := len(c.conc)
	if c.mix {
		n++
		if c.payload != "small" || !slices.Contains(c.conc, c.mixC) {
			n++ // the small-only point to compare with
		}
	}
	return n * len(c.frameworks)
}

// frameworkNames returns the names of the chosen frameworks.
func (c config) frameworkNames() []string {
	names := make([]string, len(c.frameworks))
	for i, f := range c.frameworks {
		names[i] = f.Name
	}
	return names
}
