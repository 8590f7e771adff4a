package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
	"github.com/dabbrpc/dabb/bench/hist"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// A framework with a program of its own (frameworks.Framework.Program,
// dubbo-go's) runs its client in that program too, as a second process:
// it runs the closed loop of measure itself. The two speak in lines, as
// bench/dubbogo/main.go describes: this process writes "run C LARGE PAD
// LARGEPAD WARMUP_NS DURATION_NS"; the client answers "start SAMPLE" as
// its window begins (the server is sampled then), "end SAMPLE WINDOW_NS"
// as it ends (the server again), then the result, both histograms in
// hist's text form, the first error if any, and "done".

// remotePrefix starts the control lines of a program's client process.
const remotePrefix = "dabbbench-client"

// remoteReady bounds a program's client start: its first call is retried
// until the server answers.
const remoteReady = 30 * time.Second

// programs builds each program once per run, into a temporary directory
// that removeAll deletes.
var programs = &programCache{bins: map[string]string{}}

type programCache struct {
	mu   sync.Mutex
	dir  string
	bins map[string]string // by program directory
	errs map[string]error
}

// binary returns the path of f's program, built on first use, which it
// says on log.
func (p *programCache) binary(f frameworks.Framework, log io.Writer) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if bin, ok := p.bins[f.Program]; ok {
		return bin, nil
	}
	if err := p.errs[f.Program]; err != nil {
		return "", err
	}
	fmt.Fprintf(log, "dabbbench: building %s's program (go build in %s, GOWORK=off; a cold module cache downloads it)\n", f.Name, f.Program)
	bin, err := p.build(f)
	if err != nil {
		if p.errs == nil {
			p.errs = map[string]error{}
		}
		p.errs[f.Program] = err
		return "", err
	}
	p.bins[f.Program] = bin
	return bin, nil
}

func (p *programCache) build(f frameworks.Framework) (string, error) {
	wd, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("dabbbench: build %s: %w", f.Name, err)
	}
	bench, err := findBenchModule(wd)
	if err != nil {
		return "", fmt.Errorf("dabbbench: build %s: %w", f.Name, err)
	}
	if p.dir == "" {
		if p.dir, err = os.MkdirTemp("", "dabbbench-programs-"); err != nil {
			return "", fmt.Errorf("dabbbench: build %s: %w", f.Name, err)
		}
	}
	return frameworks.BuildProgram(context.Background(), f, bench, p.dir)
}

// removeAll deletes the built programs.
func (p *programCache) removeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.dir != "" {
		os.RemoveAll(p.dir)
	}
	p.dir, p.bins, p.errs = "", map[string]string{}, nil
}

// startRemote starts f's program as the client of the server at addr and
// waits until its first call has been answered.
func startRemote(f frameworks.Framework, addr, profile string, log io.Writer) (*child, error) {
	bin, err := programs.binary(f, log)
	if err != nil {
		return nil, err
	}
	args := []string{"-client", addr}
	if profile != "" {
		args = append(args, "-cpuprofile", profile)
	}
	c, err := startProcess(f.Name+" client", bin, args, os.Environ(), remotePrefix, log)
	if err != nil {
		return nil, err
	}
	line, err := c.nextWithin(remoteReady)
	if err != nil || line != "ready" {
		c.kill()
		return nil, fmt.Errorf("dabbbench: %s client: said %q, want ready: %v", f.Name, line, err)
	}
	return c, nil
}

// measureRemote measures one window of a program's client cl against the
// server ch: the point measure would return, from the client's lines.
func measureRemote(cl, ch *child, s spec, warmup, duration time.Duration) (point, error) {
	pad := len(benchpb.NewMessage(s.size).Padding)
	largePad := len(benchpb.NewMessage(1 << 20).Padding)
	if _, err := fmt.Fprintf(cl.in, "run %d %d %d %d %d %d\n", s.c, s.large, pad, largePad, warmup.Nanoseconds(), duration.Nanoseconds()); err != nil {
		return point{}, fmt.Errorf("dabbbench: client process: %w", err)
	}
	slack := stallLimit + 10*time.Second // the client watches for stalls itself
	f, err := remoteLine(cl, "start", 3, warmup+slack)
	if err != nil {
		return point{}, err
	}
	srvFrom, err := ch.sample()
	if err != nil {
		return point{}, err
	}
	cliFrom, err := parseSample(strings.Join(f, " "))
	if err != nil {
		return point{}, err
	}
	if f, err = remoteLine(cl, "end", 4, duration+slack); err != nil {
		return point{}, err
	}
	srvTo, err := ch.sample()
	if err != nil {
		return point{}, err
	}
	cliTo, err := parseSample(strings.Join(f[:3], " "))
	if err != nil {
		return point{}, err
	}
	window, err := strconv.ParseInt(f[3], 10, 64)
	if err != nil {
		return point{}, fmt.Errorf("dabbbench: client process: bad window %q", f[3])
	}
	p := point{Payload: s.payload, C: s.c, Large: s.large, Window: time.Duration(window),
		Client: cliTo.sub(cliFrom), Server: srvTo.sub(srvFrom)}
	p.ClientCPU, p.ServerCPU = p.Client.cpu, p.Server.cpu
	if f, err = remoteLine(cl, "result", 3, slack); err != nil {
		return point{}, err
	}
	var v [3]uint64
	for i := range v {
		if v[i], err = strconv.ParseUint(f[i], 10, 64); err != nil {
			return point{}, fmt.Errorf("dabbbench: client process: bad result %q", strings.Join(f, " "))
		}
	}
	p.Calls, p.Errors, p.LargeN = v[0], v[1], v[2]
	var small, large hist.Histogram
	for _, h := range []*hist.Histogram{&small, &large} {
		line, err := cl.nextWithin(slack)
		if err != nil {
			return point{}, fmt.Errorf("dabbbench: client process: %w", err)
		}
		rest, ok := strings.CutPrefix(line, "hist ")
		_, text, _ := strings.Cut(rest, " ")
		if !ok {
			return point{}, fmt.Errorf("dabbbench: client process said %q, want a histogram", line)
		}
		if err := h.UnmarshalText([]byte(text)); err != nil {
			return point{}, fmt.Errorf("dabbbench: client process: %w", err)
		}
	}
	for {
		line, err := cl.nextWithin(slack)
		if err != nil {
			return point{}, fmt.Errorf("dabbbench: client process: %w", err)
		}
		if line == "done" {
			break
		}
		msg, ok := strings.CutPrefix(line, "error ")
		if !ok {
			return point{}, fmt.Errorf("dabbbench: client process said %q, want done", line)
		}
		p.FirstErr = msg
	}
	p.P50, p.P99, p.P999, p.Max = small.Quantile(0.5), small.Quantile(0.99), small.Quantile(0.999), small.Max()
	p.LargeP99 = large.Quantile(0.99)
	return p, nil
}

// remoteLine waits up to d for the client's next line, which must be
// word and n fields; it returns the fields. "stalled ..." is errStalled.
func remoteLine(cl *child, word string, n int, d time.Duration) ([]string, error) {
	line, err := cl.nextWithin(d)
	if err != nil {
		return nil, fmt.Errorf("dabbbench: client process, waiting for %s: %w", word, err)
	}
	if rest, ok := strings.CutPrefix(line, "stalled "); ok {
		return nil, fmt.Errorf("%w %s", errStalled, rest)
	}
	f := strings.Fields(line)
	if len(f) != n+1 || f[0] != word {
		return nil, fmt.Errorf("dabbbench: client process said %q, want %s and %d fields", line, word, n)
	}
	return f[1:], nil
}
