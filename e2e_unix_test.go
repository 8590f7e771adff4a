//go:build unix

package dabb_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/proxy"
)

// TestFreezeInstanceUnderLoad (#17): one of three server processes is
// stopped (SIGSTOP: it holds its connections and answers nothing) under
// 200 callers of an idempotent method, with the client on its defaults.
// No call fails: the adaptive per-try timeout gives up on the frozen
// instance and retries elsewhere. From 2 s after the freeze, p99 is back
// under twice its value before it.
func TestFreezeInstanceUnderLoad(t *testing.T) {
	dir := t.TempDir()
	regURL := "etcd://" + etcdtest.Start(t).Endpoint() + "/services?ttl=2s"
	var procs []*serverProcess
	for i := range 3 {
		procs = append(procs, startServerProcess(t, dir, i, regURL))
	}
	frozen := procs[1].cmd.Process
	// Cleanup runs last in, first out: this SIGCONT comes before the
	// SIGKILL that startServerProcess registered.
	t.Cleanup(func() { _ = frozen.Signal(syscall.SIGCONT) })
	// Each call's attempts, kept for the message of a call that fails,
	// with when the call began against the freeze.
	var freezeAt time.Time
	trace := func(next proxy.Invoker) proxy.Invoker {
		return func(ctx context.Context, call *proxy.Call) error {
			start := time.Now()
			var tried []string
			call.OnAttempt = func(a proxy.AttemptInfo) {
				tried = append(tried, fmt.Sprintf("%d %s at %v (after %v)", a.Attempt, a.Addr, time.Since(start).Round(time.Millisecond), a.After))
			}
			err := next(ctx, call)
			if err != nil {
				return fmt.Errorf("%w; began %v after the freeze; attempts: %s", err, start.Sub(freezeAt).Round(time.Millisecond), strings.Join(tried, "; "))
			}
			return nil
		}
	}
	c, err := proxy.NewClient(openRegistry(t, regURL), proxy.WithLogger(quiet), proxy.WithMiddleware(trace))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	d := loadDuration()
	ctx, cancel := context.WithTimeout(context.Background(), 2*d+time.Minute)
	defer cancel()
	waitInstances(ctx, t, c, 3)
	for range 300 { // warm up: every instance has answered
		if _, err := call(ctx, c, "echo", proxy.Idempotent()); err != nil {
			t.Fatal(err)
		}
	}

	start := time.Now()
	freezeAt = start.Add(d / 2)
	var (
		mu            sync.Mutex
		before, after []time.Duration
	)
	freeze := func() {
		if err := frozen.Signal(syscall.SIGSTOP); err != nil {
			t.Errorf("SIGSTOP: %v", err)
		}
	}
	calls, errs := load(ctx, 200, d, freeze, func(ctx context.Context) error {
		t0 := time.Now()
		_, err := call(ctx, c, "echo", proxy.Idempotent())
		took := time.Since(t0)
		mu.Lock()
		switch {
		case t0.After(start.Add(d/4)) && t0.Add(took).Before(freezeAt):
			before = append(before, took)
		case t0.After(freezeAt.Add(2 * time.Second)):
			after = append(after, took)
		}
		mu.Unlock()
		return err
	})
	if len(errs) > 0 {
		t.Fatalf("%d of %d idempotent calls failed on the defaults; first: %v (frozen: %s)", len(errs), calls, errs[0], procs[1].addr)
	}
	if len(before) < 100 || len(after) < 100 {
		t.Fatalf("%d calls measured before the freeze and %d after; want 100 or more of each", len(before), len(after))
	}
	p99 := func(l []time.Duration) time.Duration { slices.Sort(l); return l[len(l)*99/100] }
	pb, pa := p99(before), p99(after)
	t.Logf("%d calls, 0 failed; p99 %v before the freeze, %v from 2 s after it", calls, pb, pa)
	// A floor keeps the bound meaningful when p99 before is a few
	// milliseconds: scheduling noise alone is that large under -race.
	if limit := max(2*pb, 20*time.Millisecond); pa > limit {
		t.Errorf("p99 from 2 s after the freeze is %v, want under %v (twice its %v before)", pa, limit, pb)
	}
}
