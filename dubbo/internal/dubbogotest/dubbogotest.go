// Package dubbogotest runs dubbo-go as the other side of dabb's Dubbo
// interop tests: the peer program in testdata/dubbogo of the dubbo
// module, built once per test binary and started as provider and
// consumer processes.
//
//	zk := zktest.Shared(t)
//	p := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: zk.Addr()})
//	calls := dubbogotest.RunScript(t, dubbogotest.ConsumerConfig{ZooKeeper: zk.Addr(), Script: "inventory"})
//	sum := dubbogotest.RunLoad(t, dubbogotest.ConsumerConfig{ZooKeeper: zk.Addr(), Load: "deduct", N: 1000, K: 8})
//	load := dubbogotest.StartLoad(t, dubbogotest.ConsumerConfig{ZooKeeper: zk.Addr(), Load: "stock"})
//	load.WaitProgress(t, "100 calls answered", func(p dubbogotest.LoadProgress) bool { return p.OK >= 100 })
//	p.Kill() // kill -9; processes still running are killed when the test ends
//	sum = load.Stop(t)
//
// Both sides speak the dubbo protocol with hessian2 bodies and use
// ZooKeeper's interface-level layout under /dubbo. The provider serves
// com.example.inventory.InventoryService (sku 10086 starts with 1,000,000
// units) and com.example.Greeter; see the peer's source for their
// methods. A consumer prints one JSON line a call, which arrive here as
// [Call] values.
//
// Wrap the test binary's TestMain with [WithPeer] to remove the built
// program afterwards.
package dubbogotest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/proctest"
)

// Bounds of the waits, generous for a busy two-core machine.
const (
	// ReadyTimeout bounds a provider's start and a consumer's search for
	// a provider.
	ReadyTimeout = 60 * time.Second
	// RunTimeout bounds a consumer's script or load after it is ready.
	RunTimeout = 2 * time.Minute
	// exitPoll is how often a wait for a line checks that the peer
	// still runs.
	exitPoll = 100 * time.Millisecond
	// stderrBytes is how much of a process's standard error failures
	// show.
	stderrBytes = 8 << 10
)

// ProviderConfig says how to start a provider.
type ProviderConfig struct {
	// ZooKeeper is the registry's address, host:port. It is required.
	ZooKeeper string
	// Port is the port to serve on, on 127.0.0.1; 0 picks a free one.
	Port int
	// Group and Version are the Dubbo service group and version; empty
	// means none.
	Group, Version string
	// Application is the application name; empty means
	// "dubbogo-peer-provider".
	Application string
	// Services lists the services to export, "inventory" and "greeter";
	// nil means both.
	Services []string
}

// Provider is a running dubbo-go provider process.
type Provider struct {
	// Port is the port it serves on, on 127.0.0.1.
	Port int
	// PID is its process id.
	PID  int
	proc *proctest.Process
	out  *lines
	err  *proctest.Tail
}

// StartProvider starts a provider and waits until it is serving and
// registered in ZooKeeper. It is killed when the test ends.
func StartProvider(t testing.TB, cfg ProviderConfig) *Provider {
	t.Helper()
	bin := Binary(t)
	if cfg.ZooKeeper == "" {
		t.Fatal("dubbogotest: ProviderConfig.ZooKeeper is empty")
	}
	if cfg.Port == 0 {
		ports, err := proctest.FreePorts(1, 20880) // never Dubbo's default
		if err != nil {
			t.Fatalf("dubbogotest: %v", err)
		}
		cfg.Port = ports[0]
	}
	args := []string{"provider", "-zk", cfg.ZooKeeper, "-port", strconv.Itoa(cfg.Port)}
	args = appendCommon(args, cfg.Group, cfg.Version, cfg.Application)
	if len(cfg.Services) > 0 {
		args = append(args, "-services", strings.Join(cfg.Services, ","))
	}
	p := &Provider{Port: cfg.Port}
	p.proc, p.out, p.err = start(t, bin, args)
	var ready struct {
		PID int `json:"pid"`
	}
	if err := p.out.event(p.proc, "ready", &ready); err != nil {
		t.Fatalf("dubbogotest: provider ready line: %v", err)
	}
	p.PID = ready.PID
	return p
}

// Addr returns the provider's address, 127.0.0.1:port.
func (p *Provider) Addr() string { return "127.0.0.1:" + strconv.Itoa(p.Port) }

// Stop sends SIGTERM, on which the provider deregisters from ZooKeeper
// and exits, and waits for it to exit.
func (p *Provider) Stop() { p.proc.Stop() }

// Kill kills the provider with SIGKILL, leaving its ZooKeeper nodes to
// expire with its session, and waits for it to exit.
func (p *Provider) Kill() { p.proc.Kill() }

// Running reports whether the provider process is running.
func (p *Provider) Running() bool { return p.proc.Running() }

// Stderr returns the last of what the provider wrote to standard error
// (dubbo-go's log).
func (p *Provider) Stderr() string { return p.err.String() }

// ConsumerConfig says what a consumer does. Exactly one of Script and
// Load is set.
type ConsumerConfig struct {
	// ZooKeeper is the registry's address, host:port. It is required.
	ZooKeeper string
	// Group and Version are the Dubbo service group and version to
	// call; empty means none.
	Group, Version string
	// Application is the application name; empty means
	// "dubbogo-peer-consumer".
	Application string
	// Script is the calls to make: "inventory" (every method of
	// InventoryService, errors included) or "greeter".
	Script string
	// Generic makes the script's calls with Dubbo's $invoke, POJOs as
	// maps with a "class" key.
	Generic bool
	// RequestID is the requestId of the inventory script's deductOnce
	// calls; empty means one unique to the process.
	RequestID string
	// Load is the method to call under load: "deduct" (one unit of SKU
	// a call, without retries) or "stock".
	Load string
	// N is the number of load calls; 0 means until [Load.Stop].
	N int
	// K is the number of goroutines calling; 0 means 8.
	K int
	// SKU is the sku of load calls; 0 means 10086.
	SKU int64
	// Timeout bounds each call; 0 means 5 s.
	Timeout time.Duration
}

// Call is one call a consumer's script made, as the consumer printed it.
type Call struct {
	// Step names the call in the script, such as "deduct-zero".
	Step string `json:"step"`
	// Method is the Java method called.
	Method string `json:"method"`
	// Generic reports a call made with $invoke.
	Generic bool `json:"generic"`
	// Result is the value returned, as JSON; a POJO returned to a
	// generic call is an object with a "class" key.
	Result json.RawMessage `json:"result"`
	// ResultType is the Go type dubbo-go decoded the result into.
	ResultType string `json:"result_type"`
	// ErrorClass is the Java class of the exception the provider threw;
	// empty for an error that is not an exception (timeout, no
	// provider).
	ErrorClass string `json:"error_class"`
	// Error is the error's message; empty when the call succeeded.
	Error string `json:"error"`
}

// Decode decodes the call's result into v.
func (c Call) Decode(v any) error {
	if len(c.Result) == 0 {
		return fmt.Errorf("step %s: no result (error %s: %q)", c.Step, c.ErrorClass, c.Error)
	}
	return json.Unmarshal(c.Result, v)
}

// LoadSummary is what a consumer's load printed when it ended.
type LoadSummary struct {
	Method string `json:"method"`
	// Calls made, answered or not.
	Calls int64 `json:"calls"`
	// OK counts calls answered without an error.
	OK int64 `json:"ok"`
	// False counts deductions answered false (stock short).
	False int64 `json:"false"`
	// Failures counts calls answered with an error.
	Failures int64 `json:"failures"`
	// Errors holds the first few errors, "CLASS: message".
	Errors []string `json:"errors"`
	// StockBefore and StockAfter are the sku's stock around the load;
	// -1 when the stock call failed.
	StockBefore int64   `json:"stock_before"`
	StockAfter  int64   `json:"stock_after"`
	Seconds     float64 `json:"seconds"`
}

// RunScript runs a consumer's script to its end and returns its calls in
// order.
func RunScript(t testing.TB, cfg ConsumerConfig) []Call {
	t.Helper()
	if cfg.Script == "" || cfg.Load != "" {
		t.Fatal("dubbogotest: RunScript needs Script and no Load")
	}
	c := startConsumer(t, cfg)
	defer c.proc.Kill()
	if err := c.out.event(c.proc, "done", nil); err != nil {
		t.Fatalf("dubbogotest: consumer script %s: %v\nstderr:\n%s", cfg.Script, err, c.err.String())
	}
	var calls []Call
	for _, m := range c.out.all() {
		var call Call
		if err := json.Unmarshal(m, &call); err == nil && call.Step != "" {
			calls = append(calls, call)
		}
	}
	return calls
}

// Load is a consumer's load running in the background.
type Load struct {
	c *consumer
}

// StartLoad starts a consumer's load and returns once its first call has
// been answered. The consumer is killed when the test ends.
func StartLoad(t testing.TB, cfg ConsumerConfig) *Load {
	t.Helper()
	if cfg.Load == "" || cfg.Script != "" {
		t.Fatal("dubbogotest: StartLoad needs Load and no Script")
	}
	c := startConsumer(t, cfg)
	if err := c.out.event(c.proc, "started", nil); err != nil {
		t.Fatalf("dubbogotest: consumer load %s: %v\nstderr:\n%s", cfg.Load, err, c.err.String())
	}
	return &Load{c: c}
}

// Wait waits for a load of N calls to end and returns its summary.
func (l *Load) Wait(t testing.TB) LoadSummary {
	t.Helper()
	var s LoadSummary
	if err := l.c.out.event(l.c.proc, "load", &s); err != nil {
		t.Fatalf("dubbogotest: consumer load: %v\nstderr:\n%s", err, l.c.err.String())
	}
	l.c.proc.Stop()
	return s
}

// Stop ends the load (SIGTERM), waits for its summary and returns it.
func (l *Load) Stop(t testing.TB) LoadSummary {
	t.Helper()
	l.c.proc.Stop() // the consumer prints its summary before it exits
	return l.Wait(t)
}

// LoadProgress is what a consumer's load printed last while it ran; it
// prints every 100 ms.
type LoadProgress struct {
	// Calls made so far, answered or not.
	Calls int64 `json:"calls"`
	// OK counts calls answered without an error.
	OK int64 `json:"ok"`
	// Failures counts calls answered with an error.
	Failures int64 `json:"failures"`
}

// WaitProgress waits up to RunTimeout for a progress line for which cond
// is true and returns it. It fails the test when the load ends first.
func (l *Load) WaitProgress(t testing.TB, what string, cond func(LoadProgress) bool) LoadProgress {
	t.Helper()
	var p LoadProgress
	match := func(msg json.RawMessage) bool {
		return json.Unmarshal(msg, &p) == nil && cond(p)
	}
	if err := l.c.out.eventWhere(l.c.proc, "progress", match); err != nil {
		t.Fatalf("dubbogotest: consumer load, waiting for %s: %v (last progress %+v)\nstderr:\n%s", what, err, p, l.c.err.String())
	}
	return p
}

// RunLoad runs a consumer's load of N calls to its end and returns its
// summary.
func RunLoad(t testing.TB, cfg ConsumerConfig) LoadSummary {
	t.Helper()
	if cfg.N <= 0 {
		t.Fatal("dubbogotest: RunLoad needs N > 0")
	}
	return StartLoad(t, cfg).Wait(t)
}

// consumer is a running consumer process.
type consumer struct {
	proc *proctest.Process
	out  *lines
	err  *proctest.Tail
}

// startConsumer starts a consumer and waits until it has found a
// provider.
func startConsumer(t testing.TB, cfg ConsumerConfig) *consumer {
	t.Helper()
	bin := Binary(t)
	if cfg.ZooKeeper == "" {
		t.Fatal("dubbogotest: ConsumerConfig.ZooKeeper is empty")
	}
	args := []string{"consumer", "-zk", cfg.ZooKeeper}
	args = appendCommon(args, cfg.Group, cfg.Version, cfg.Application)
	if cfg.Script != "" {
		args = append(args, "-script", cfg.Script)
	}
	if cfg.Generic {
		args = append(args, "-generic")
	}
	if cfg.RequestID != "" {
		args = append(args, "-request-id", cfg.RequestID)
	}
	if cfg.Load != "" {
		k := cfg.K
		if k == 0 {
			k = 8
		}
		args = append(args, "-load", cfg.Load, "-n", strconv.Itoa(cfg.N), "-k", strconv.Itoa(k))
	}
	if cfg.SKU != 0 {
		args = append(args, "-sku", strconv.FormatInt(cfg.SKU, 10))
	}
	if cfg.Timeout > 0 {
		args = append(args, "-timeout", cfg.Timeout.String())
	}
	c := &consumer{}
	c.proc, c.out, c.err = start(t, bin, args)
	return c
}

func appendCommon(args []string, group, version, app string) []string {
	if group != "" {
		args = append(args, "-group", group)
	}
	if version != "" {
		args = append(args, "-version", version)
	}
	if app != "" {
		args = append(args, "-app", app)
	}
	return args
}

// start starts the peer with args and waits for its "ready" line. The
// process is killed when the test ends.
func start(t testing.TB, bin string, args []string) (*proctest.Process, *lines, *proctest.Tail) {
	t.Helper()
	out := newLines()
	stderr := proctest.NewTail(stderrBytes)
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = out, stderr
	proc := new(proctest.Process)
	t.Cleanup(proc.Kill)
	ready := func(context.Context) error {
		if out.has("ready") {
			return nil
		}
		return errors.New(`no "ready" line yet`)
	}
	err := proc.Start(cmd, ReadyTimeout, ready)
	// A short script may be over before Start's next look for the
	// line: its exit is no failure once the line was printed.
	if errors.Is(err, proctest.ErrExited) && out.has("ready") {
		err = nil
	}
	if err != nil {
		t.Fatalf("dubbogotest: peer %s: %v\nstderr:\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return proc, out, stderr
}

// lines collects the JSON lines a peer prints on standard output; other
// lines are dropped. It is safe for concurrent use.
type lines struct {
	mu      sync.Mutex // guards following
	partial []byte
	msgs    []json.RawMessage
	events  map[string]json.RawMessage // the last line of each event
	changed chan struct{}              // closed and replaced on each line
}

func newLines() *lines {
	return &lines{events: map[string]json.RawMessage{}, changed: make(chan struct{})}
}

// Write splits p into lines and keeps those that are JSON objects.
func (l *lines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.partial = append(l.partial, p...)
	for {
		i := strings.IndexByte(string(l.partial), '\n')
		if i < 0 {
			break
		}
		line := strings.TrimSpace(string(l.partial[:i]))
		l.partial = l.partial[i+1:]
		if !strings.HasPrefix(line, "{") || !json.Valid([]byte(line)) {
			continue
		}
		msg := json.RawMessage(line)
		l.msgs = append(l.msgs, msg)
		var e struct {
			Event string `json:"event"`
		}
		if json.Unmarshal(msg, &e) == nil && e.Event != "" {
			l.events[e.Event] = msg
		}
		close(l.changed)
		l.changed = make(chan struct{})
	}
	return len(p), nil
}

func (l *lines) has(event string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.events[event]
	return ok
}

// event waits up to RunTimeout for a line {"event": name, ...} and
// decodes it into v when v is not nil. It fails early when proc exits
// without printing one.
func (l *lines) event(proc *proctest.Process, name string, v any) error {
	var err error
	match := func(msg json.RawMessage) bool {
		if v != nil {
			err = json.Unmarshal(msg, v)
		}
		return true
	}
	if werr := l.eventWhere(proc, name, match); werr != nil {
		return werr
	}
	return err
}

// eventWhere waits up to RunTimeout for the last line {"event": name,
// ...} to satisfy match. It fails early when proc exits first.
func (l *lines) eventWhere(proc *proctest.Process, name string, match func(json.RawMessage) bool) error {
	deadline := time.NewTimer(RunTimeout)
	defer deadline.Stop()
	// An exit is no event here; it is looked for between lines. Once
	// the process has exited, its output has all been written.
	exitCheck := time.NewTicker(exitPoll)
	defer exitCheck.Stop()
	for exited := false; ; {
		l.mu.Lock()
		msg, ok := l.events[name]
		changed := l.changed
		l.mu.Unlock()
		switch {
		case ok && match(msg):
			return nil
		case exited:
			return fmt.Errorf("the peer exited without a matching %q line", name)
		}
		select {
		case <-changed:
		case <-exitCheck.C:
			exited = !proc.Running()
		case <-deadline.C:
			return fmt.Errorf("no %q line within %v", name, RunTimeout)
		}
	}
}

// all returns the JSON lines printed so far.
func (l *lines) all() []json.RawMessage {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]json.RawMessage(nil), l.msgs...)
}
