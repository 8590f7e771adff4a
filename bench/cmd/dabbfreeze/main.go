// Command dabbfreeze runs the frozen-instance scenario: three dabb
// provider processes, one client on its defaults with 200 callers of an
// idempotent method, and one provider stopped with SIGSTOP halfway. It
// prints p99 per 250 ms window, as a multiple of the baseline p99 (the
// calls that began in the 2 s before the freeze), and the breaker's
// changes of state.
//
//	cd bench && go run ./cmd/dabbfreeze                 # one run
//	go run ./cmd/dabbfreeze -runs 5                      # five runs, one summary line each
//	go run ./cmd/dabbfreeze -trace                       # also the calls of the worst window
//	go run ./cmd/dabbfreeze -freeze=false                # the same run without the freeze
//
// A call belongs to the window in which it began. The verdict is the worst
// window from 2 s after the freeze to the end of the run. Each provider is
// this program with -server; it exits when its stdin closes.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"time"
)

// config is the scenario's flags.
type config struct {
	callers   int
	runs      int
	before    time.Duration // load before the freeze; the baseline is its last 2 s
	after     time.Duration // load after the freeze
	window    time.Duration
	freeze    bool
	trace     bool
	verbose   bool
	exectrace string
	heartbeat time.Duration
}

func main() {
	if slices.Contains(os.Args[1:], "-server") {
		if err := serverMain(os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		return
	}
	var cfg config
	fs := flag.NewFlagSet("dabbfreeze", flag.ContinueOnError)
	fs.IntVar(&cfg.callers, "c", 200, "callers (goroutines calling back to back)")
	fs.IntVar(&cfg.runs, "runs", 1, "runs, each with fresh provider processes")
	fs.DurationVar(&cfg.before, "before", 4*time.Second, "load before the freeze (at least 3s: the baseline is its last 2 s)")
	fs.DurationVar(&cfg.after, "after", 16*time.Second, "load after the freeze")
	fs.DurationVar(&cfg.window, "window", 250*time.Millisecond, "window of the p99 figures")
	fs.BoolVar(&cfg.freeze, "freeze", true, "stop one provider with SIGSTOP (false: a control run)")
	fs.BoolVar(&cfg.trace, "trace", false, "print the calls of the worst window over 2x the baseline, with their attempts")
	fs.BoolVar(&cfg.verbose, "v", false, "print every window, not only those over 2x the baseline")
	fs.DurationVar(&cfg.heartbeat, "heartbeat", 0, "the client's transport.Config.HeartbeatInterval (0: its default)")
	fs.StringVar(&cfg.exectrace, "exectrace", "", "write a runtime execution trace of the client to this file (go tool trace)")
	if err := fs.Parse(os.Args[1:]); err != nil {
		if err == flag.ErrHelp {
			return
		}
		os.Exit(2)
	}
	if cfg.before < 3*time.Second || cfg.callers < 1 || cfg.runs < 1 || cfg.window <= 0 || cfg.after < 3*time.Second {
		fmt.Fprintln(os.Stderr, "dabbfreeze: want -before >= 3s, -after >= 3s, -c >= 1, -runs >= 1, -window > 0")
		os.Exit(2)
	}
	var worst []float64
	for i := range cfg.runs {
		r, err := runOnce(cfg)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("run %d: ", i+1)
		r.summary(os.Stdout)
		worst = append(worst, r.worstRatio())
		if cfg.runs == 1 || cfg.verbose {
			r.print(os.Stdout, cfg)
		}
	}
	if cfg.runs > 1 {
		slices.Sort(worst)
		fmt.Printf("worst window from 2 s after the freeze, over %d runs: min %.2fx, median %.2fx, max %.2fx the baseline p99\n",
			len(worst), worst[0], worst[len(worst)/2], worst[len(worst)-1])
	}
}
