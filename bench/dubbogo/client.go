package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"dubbo.apache.org/dubbo-go/v3/client"
	"dubbo.apache.org/dubbo-go/v3/common/constant"
	"dubbo.apache.org/dubbo-go/v3/remoting/getty"
)

const (
	// callTimeout is each call's timeout, as long as dabb-hessian2's, so
	// that a loaded machine measures latency instead of failing calls.
	callTimeout = 30 * time.Second
	// readyWithin bounds the first call's retries.
	readyWithin = 10 * time.Second
	// stallLimit is how long no call may complete before a run gives up,
	// dabbbench's own limit.
	stallLimit = 30 * time.Second
)

var errBadReplyBase = errors.New("bad reply")

func errBadReply(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errBadReplyBase, fmt.Sprintf(format, args...))
}

// echoClient calls EchoService.echo on one connection of dubbo-go.
type echoClient struct{ conn *client.Connection }

func dial(addr string) (*echoClient, error) {
	conf := getty.GetDefaultClientConfig()
	conf.GettySessionParam.MaxMsgLen = maxMsgLen
	getty.SetClientConf(*conf)
	cli, err := client.NewClient()
	if err != nil {
		return nil, fmt.Errorf("new client: %w", err)
	}
	conn, err := cli.Dial(echoInterface,
		client.WithURL("dubbo://"+addr),
		client.WithProtocolDubbo(),
		client.WithSerialization(constant.Hessian2Serialization),
		client.WithRequestTimeout(callTimeout),
	)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return &echoClient{conn: conn}, nil
}

func (c *echoClient) echo(ctx context.Context, req *BenchmarkMessage) error {
	reply := new(BenchmarkMessage)
	if err := c.conn.CallUnary(ctx, []any{req}, reply, "echo"); err != nil {
		return err
	}
	return check(req, reply)
}

// callLoop dials addr, checks a first call, prints "ready", and serves
// run and sample commands until stdin closes.
func callLoop(addr string, stdin io.Reader, out *lines) error {
	c, err := dial(addr)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(readyWithin)
	for {
		err = c.echo(context.Background(), newMessage(0))
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("first call: %w", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	out.printf("ready")
	return commands(stdin, out, func(cmd string, f []string) bool {
		if cmd != "run" {
			return false
		}
		spec, err := parseRun(f)
		if err != nil {
			out.printf("error %v", err)
			return true
		}
		c.run(spec, out)
		return true
	})
}

// runSpec is one window: c goroutines with pad bytes of padding and large
// more with largePad, a warm-up, then the measured window.
type runSpec struct {
	c, large, pad, largePad int
	warmup, duration        time.Duration
}

func parseRun(f []string) (runSpec, error) {
	if len(f) != 6 {
		return runSpec{}, fmt.Errorf("run wants C LARGE PAD LARGEPAD WARMUP_NS DURATION_NS, got %q", strings.Join(f, " "))
	}
	var v [6]int64
	for i, s := range f {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 0 {
			return runSpec{}, fmt.Errorf("run: %q is not a non-negative integer", s)
		}
		v[i] = n
	}
	s := runSpec{c: int(v[0]), large: int(v[1]), pad: int(v[2]), largePad: int(v[3]),
		warmup: time.Duration(v[4]), duration: time.Duration(v[5])}
	if s.c < 1 || s.c+s.large > 100_000 || s.duration <= 0 {
		return runSpec{}, fmt.Errorf("run: want 1 to 100000 goroutines and a window > 0, got %q", strings.Join(f, " "))
	}
	return s, nil
}

// worker is one calling goroutine's tallies.
type worker struct {
	done  atomic.Uint64 // calls completed, failed or not: for the stall watch
	h     histogram
	calls uint64
	errs  uint64 // failed calls, in the window or not
	first error  // the first failed call of the window
	// the first failed call outside the window, and where
	otherFirst error
	otherWhere string
}

// run is dabbbench's closed loop: as its measure does, the goroutines
// call back to back; only calls that complete inside the window count,
// and errors count wherever they happen.
func (c *echoClient) run(s runSpec, out *lines) {
	var measuring, stop atomic.Bool
	workers := make([]*worker, s.c+s.large)
	var wg sync.WaitGroup
	for i := range workers {
		w := &worker{}
		workers[i] = w
		pad := s.pad
		if i >= s.c {
			pad = s.largePad
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			req := newMessage(pad)
			ctx := context.Background()
			for !stop.Load() {
				t0 := time.Now()
				err := c.echo(ctx, req)
				d := time.Since(t0)
				w.done.Add(1)
				in := measuring.Load() && !stop.Load()
				if err != nil {
					w.errs++
					switch {
					case in && w.first == nil:
						w.first = err
					case !in && w.otherFirst == nil:
						w.otherFirst, w.otherWhere = err, "in the warm-up"
						if measuring.Load() {
							w.otherWhere = "after the window"
						}
					}
					time.Sleep(time.Millisecond) // do not spin on a broken client
					continue
				}
				if in {
					w.calls++
					w.h.record(d)
				}
			}
		}()
	}
	progress := func() uint64 {
		var n uint64
		for _, w := range workers {
			n += w.done.Load()
		}
		return n
	}
	if !watch(progress, time.After(s.warmup), out, "in the warm-up") {
		stop.Store(true)
		return
	}
	runtime.GC() // each window starts from the same heap state
	out.printf("start %s", takeSample())
	t0 := time.Now()
	measuring.Store(true)
	if !watch(progress, time.After(s.duration), out, "in the window") {
		stop.Store(true)
		return
	}
	stop.Store(true)
	window := time.Since(t0)
	out.printf("end %s %d", takeSample(), window.Nanoseconds())
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	if !watch(progress, done, out, "while the window's last calls finished") {
		return
	}
	var small, large histogram
	var calls, errs, largeCalls uint64
	var first string
	for i, w := range workers {
		if i >= s.c {
			large.merge(&w.h)
			largeCalls += w.calls
		} else {
			small.merge(&w.h)
			calls += w.calls
		}
		errs += w.errs
		if first == "" && w.first != nil {
			first = w.first.Error()
		}
	}
	for _, w := range workers {
		if first == "" && w.otherFirst != nil {
			first = w.otherWhere + ": " + w.otherFirst.Error()
		}
	}
	out.printf("result %d %d %d", calls, errs, largeCalls)
	out.printf("hist small %s", &small)
	out.printf("hist large %s", &large)
	if first != "" {
		out.printf("error %s", strings.Join(strings.Fields(first), " "))
	}
	out.printf("done")
}

// watch waits for until and reports whether it came; it gives up,
// printing "stalled WHERE", once progress has not moved for stallLimit.
func watch[T any](progress func() uint64, until <-chan T, out *lines, where string) bool {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	last, since := progress(), time.Now()
	for {
		select {
		case <-until:
			return true
		case <-tick.C:
			if n := progress(); n != last {
				last, since = n, time.Now()
			} else if time.Since(since) >= stallLimit {
				out.printf("stalled %s: no call completed for %v", where, stallLimit)
				return false
			}
		}
	}
}
