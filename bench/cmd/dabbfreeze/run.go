package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"runtime/metrics"
	"runtime/trace"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/bench/echo"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
	"github.com/dabbrpc/dabb/protocol"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"github.com/dabbrpc/dabb/transport"
)

// serverMain is a provider: it serves Echo on a loopback port, prints
// "addr HOST:PORT", and exits when stdin closes.
func serverMain(stdin io.Reader, stdout io.Writer) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("dabbfreeze: server: %w", err)
	}
	srv := dabb.NewServer(dabb.WithLogger(slog.New(slog.DiscardHandler)))
	if err := echo.RegisterEchoServer(srv, echo.Server{}); err != nil {
		return fmt.Errorf("dabbfreeze: server: %w", err)
	}
	go srv.Serve(l)
	fmt.Fprintf(stdout, "addr %s\n", l.Addr())
	_, _ = io.Copy(io.Discard, stdin)
	return srv.Close()
}

// provider is one provider process.
type provider struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	addr string
}

func startProvider() (*provider, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-server")
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
		return nil, fmt.Errorf("dabbfreeze: start provider: %w", err)
	}
	p := &provider{cmd: cmd, in: in}
	line := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if a, ok := strings.CutPrefix(sc.Text(), "addr "); ok {
				line <- a
			}
		}
		close(line)
	}()
	select {
	case a, ok := <-line:
		if !ok {
			p.stop()
			return nil, fmt.Errorf("dabbfreeze: provider exited before listening")
		}
		p.addr = a
	case <-time.After(30 * time.Second):
		p.stop()
		return nil, fmt.Errorf("dabbfreeze: provider did not listen within 30 s")
	}
	return p, nil
}

// stop resumes the provider if it was stopped, closes its stdin and waits
// for it, killing it after 5 s.
func (p *provider) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGCONT)
	p.in.Close()
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-done
	}
}

// attemptRec is one attempt of a traced call.
type attemptRec struct {
	addr  string
	at    time.Duration // since the call began
	after string        // the failure of the attempt before it
}

// callRec is one call: when it began against the freeze, how long it
// took, and its attempts when it made more than one or tried the frozen
// provider.
type callRec struct {
	start    time.Duration
	took     time.Duration
	failed   bool
	attempts []attemptRec
}

// event is a breaker change, a log line or a failed attempt on the
// frozen provider.
type event struct {
	t    time.Time
	what string
}

// result is one run.
type result struct {
	frozen   string
	froze    bool // false in a control run: frozen names the provider that would have been
	freezeAt time.Time
	calls    []callRec
	events   []event
	process  []processEvent
	err      error // the first failed call's
	nfail    int
}

// attemptEvent begins the event of a failed attempt on the frozen
// provider; its status follows.
const attemptEvent = "failed attempt on the frozen provider, status "

// processEvent is a 1 ms sleep of the client process that overslept by
// 10 ms or more, or during which a GC cycle ended.
type processEvent struct {
	t    time.Time // when the sleep began
	over time.Duration
	gc   bool
}

type traceKey struct{}

// callTrace collects one call's attempts.
type callTrace struct {
	start    time.Time
	attempts []attemptRec
}

// recorder receives the client's observer reports and log records.
type recorder struct {
	mu      sync.Mutex
	frozen  string
	events  []event
	process []processEvent
}

func (r *recorder) add(what string) {
	now := time.Now()
	r.mu.Lock()
	r.events = append(r.events, event{now, what})
	r.mu.Unlock()
}

func (r *recorder) Attempted(_, _, addr string, status protocol.Status, latency time.Duration) {
	if addr == r.frozen && status != protocol.StatusOK {
		r.add(fmt.Sprintf("%s%d", attemptEvent, status))
	}
}

func (r *recorder) Retried(string, string, protocol.Status) {}

func (r *recorder) BreakerChanged(addr, from, to string) {
	who := "a live provider"
	if addr == r.frozen {
		who = "the frozen provider"
	}
	r.add(fmt.Sprintf("breaker of %s: %s -> %s", who, from, to))
}

// logHandler turns the client's log records into events.
type logHandler struct{ r *recorder }

func (h logHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h logHandler) Handle(_ context.Context, rec slog.Record) error {
	if rec.Message == "dabb: circuit breaker" {
		return nil // the observer reports these
	}
	var b strings.Builder
	b.WriteString("log: " + rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	h.r.add(b.String())
	return nil
}
func (h logHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h logHandler) WithGroup(string) slog.Handler      { return h }

// runOnce starts three providers and a client, loads them, freezes one,
// and returns every call.
func runOnce(cfg config) (*result, error) {
	var provs []*provider
	defer func() {
		for _, p := range provs {
			p.stop()
		}
	}()
	var ins []registry.Instance
	for range 3 {
		p, err := startProvider()
		if err != nil {
			return nil, err
		}
		provs = append(provs, p)
		ins = append(ins, registry.Instance{Service: echo.EchoServiceName, ID: p.addr, Addr: p.addr})
	}
	frozen := provs[1]
	rec := &recorder{frozen: frozen.addr}
	tracing := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			if ct, ok := ctx.Value(traceKey{}).(*callTrace); ok {
				call.OnAttempt = func(a proxy.AttemptInfo) {
					after := ""
					if a.After != nil {
						after = a.After.Error()
					}
					ct.attempts = append(ct.attempts, attemptRec{a.Addr, time.Since(ct.start), after})
				}
			}
			return next(ctx, call)
		}
	}
	c, err := proxy.NewClient(static.New(ins...), proxy.WithLogger(slog.New(logHandler{rec})),
		proxy.WithObserver(rec), proxy.WithMiddleware(tracing), proxy.WithTransport(transport.Config{HeartbeatInterval: cfg.heartbeat}))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	req := benchpb.NewMessage(0)
	invoke := func(ctx context.Context) error {
		resp := new(benchpb.BenchmarkMessage)
		// Say with proxy.Idempotent: the default 1 s budget, retries allowed.
		return c.Invoke(ctx, echo.EchoServiceName, "Say", req, resp, proxy.Idempotent())
	}
	for i := range 300 { // every provider has answered and has its connections
		if err := invoke(context.Background()); err != nil {
			return nil, fmt.Errorf("dabbfreeze: warm-up call %d: %w", i, err)
		}
	}
	if cfg.exectrace != "" {
		f, err := os.Create(cfg.exectrace)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		if err := trace.Start(f); err != nil {
			return nil, err
		}
		defer trace.Stop()
	}

	start := time.Now()
	freezeAt := start.Add(cfg.before)
	stop := make(chan struct{})
	res := &result{frozen: frozen.addr, froze: cfg.freeze, freezeAt: freezeAt}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range cfg.callers {
		wg.Go(func() {
			var mine []callRec
			var nfail int
			var first error
			for {
				select {
				case <-stop:
					mu.Lock()
					res.calls = append(res.calls, mine...)
					res.nfail += nfail
					if res.err == nil {
						res.err = first
					}
					mu.Unlock()
					return
				default:
				}
				ct := &callTrace{start: time.Now()}
				err := invoke(context.WithValue(context.Background(), traceKey{}, ct))
				took := time.Since(ct.start)
				r := callRec{start: ct.start.Sub(freezeAt), took: took, failed: err != nil}
				if len(ct.attempts) > 1 || len(ct.attempts) == 1 && ct.attempts[0].addr == frozen.addr {
					r.attempts = ct.attempts
				}
				if err != nil {
					nfail++
					if first == nil {
						first = err
					}
				}
				mine = append(mine, r)
			}
		})
	}
	// The process's own stalls and its GC cycles, beside the calls: a
	// window whose calls all slowed at once while a 1 ms sleep overslept
	// says the machine or the runtime stalled, not a provider.
	watchDone := make(chan struct{})
	var watchWG sync.WaitGroup
	watchWG.Go(func() { watchProcess(rec, watchDone) })
	defer func() { close(watchDone); watchWG.Wait() }()
	time.Sleep(time.Until(freezeAt))
	if cfg.freeze {
		if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			close(stop)
			wg.Wait()
			return nil, fmt.Errorf("dabbfreeze: SIGSTOP: %w", err)
		}
	}
	time.Sleep(time.Until(freezeAt.Add(cfg.after)))
	close(stop)
	wg.Wait()
	rec.mu.Lock()
	res.events = rec.events
	res.process = rec.process
	rec.mu.Unlock()
	return res, nil
}

// watchProcess records, until done closes, each 1 ms sleep that overslept
// by 10 ms or more, and each GC cycle that ended.
func watchProcess(rec *recorder, done <-chan struct{}) {
	sample := []metrics.Sample{{Name: "/gc/cycles/total:gc-cycles"}}
	metrics.Read(sample)
	cycles := sample[0].Value.Uint64()
	for {
		t0 := time.Now()
		select {
		case <-done:
			return
		case <-time.After(time.Millisecond):
		}
		now := time.Now()
		over := now.Sub(t0) - time.Millisecond
		metrics.Read(sample)
		n := sample[0].Value.Uint64()
		if over >= 10*time.Millisecond || n != cycles {
			rec.mu.Lock()
			rec.process = append(rec.process, processEvent{t: t0, over: max(over, 0), gc: n != cycles})
			rec.mu.Unlock()
		}
		cycles = n
	}
}
