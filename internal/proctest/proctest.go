// Package proctest runs a server program as a child process for tests: the
// machinery that internal/etcdtest and internal/zktest share.
//
// A helper builds the command and says when the server is ready:
//
//	ports, err := proctest.FreePorts(1, 2181) // never the server's default
//	var p proctest.Process
//	err = p.Start(exec.Command(bin, args...), 30*time.Second, probe)
//	p.Stop()  // SIGTERM to the process group, SIGKILL after StopTimeout
//	err = p.Start(exec.Command(bin, args...), 30*time.Second, probe) // again
//	p.Kill()
//
// One server per test package, started by the first test that asks:
//
//	var shared proctest.Shared[Server]
//	srv, err := shared.Get(startServer)     // in the helper's Shared(t)
//	return shared.Wrap(m, (*Server).destroy) // in the helper's WithShared(m)
//
// The process runs in its own process group, which is signalled as a whole,
// and on Linux the kernel kills it when the test binary dies.
package proctest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"
)

// StopTimeout bounds a graceful stop before the process group is killed.
const StopTimeout = 10 * time.Second

// pollInterval is how often Start asks whether the server is ready.
const pollInterval = 50 * time.Millisecond

var (
	// ErrRunning reports a Start while the process is still running.
	ErrRunning = errors.New("proctest: server already running")
	// ErrExited reports a process that exited before it was ready.
	ErrExited = errors.New("proctest: server exited before it was ready")
)

// Process is a server process that can be stopped and started again. The
// zero value is ready to use; its methods are safe for concurrent use.
type Process struct {
	mu        sync.Mutex // guards following
	cmd       *exec.Cmd
	done      chan struct{} // closed when cmd has exited
	stopAfter time.Duration // zero means StopTimeout; tests shorten it
}

// Start starts cmd in its own process group (replacing cmd.SysProcAttr)
// and calls ready every 50 ms until it returns nil. When the process exits
// first, or ready has not succeeded within timeout, Start kills the process
// group, waits for the process to exit and returns an error holding ready's
// last error. Start fails with [ErrRunning] while an earlier process runs.
func (p *Process) Start(cmd *exec.Cmd, timeout time.Duration, ready func(context.Context) error) error {
	if cmd == nil || ready == nil || timeout <= 0 {
		return errors.New("proctest: Start needs a command, a ready check and a positive timeout")
	}
	p.mu.Lock()
	if p.done != nil {
		select {
		case <-p.done:
		default:
			p.mu.Unlock()
			return ErrRunning
		}
	}
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		p.mu.Unlock()
		return fmt.Errorf("proctest: start %s: %w", cmd.Path, err)
	}
	done := make(chan struct{})
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	if err := waitReady(done, timeout, ready); err != nil {
		p.Kill()
		return err
	}
	return nil
}

// waitReady polls ready until it succeeds, exited is closed or timeout
// passes.
func waitReady(exited <-chan struct{}, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	tick := time.NewTicker(pollInterval)
	defer tick.Stop()
	for {
		last := ready(ctx)
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			// A short-lived process may have become ready and exited
			// between two checks: its output is all written by now.
			if last = ready(ctx); last == nil {
				return nil
			}
			return fmt.Errorf("%w (last check: %v)", ErrExited, last)
		case <-ctx.Done():
			return fmt.Errorf("proctest: server not ready within %v: %w", timeout, last)
		case <-tick.C:
		}
	}
}

// Stop sends SIGTERM to the process group and waits for the process to
// exit, killing the group after [StopTimeout]. It does nothing when the
// process is not running.
func (p *Process) Stop() { p.signal(syscall.SIGTERM) }

// Kill sends SIGKILL to the process group and waits for the process to
// exit. It does nothing when the process is not running.
func (p *Process) Kill() { p.signal(syscall.SIGKILL) }

// Running reports whether the process is running.
func (p *Process) Running() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.done == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// signal sends sig to the process group and waits for the process to
// exit, killing the group after the stop timeout.
func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done, after := p.cmd, p.done, p.stopAfter
	p.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	if after <= 0 {
		after = StopTimeout
	}
	killGroup(cmd.Process, sig)
	t := time.NewTimer(after)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
		killGroup(cmd.Process, syscall.SIGKILL)
		<-done
	}
}

// FreePorts returns n distinct ports free on 127.0.0.1 at the moment,
// none of them in avoid (a server's default ports, which a test must never
// take from a real server).
func FreePorts(n int, avoid ...int) ([]int, error) {
	if n < 1 {
		return nil, fmt.Errorf("proctest: FreePorts(%d): want at least one port", n)
	}
	ports := make([]int, 0, n)
	// Listeners stay open until all ports are found, so the ports differ.
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for tries := 0; len(ports) < n; tries++ {
		if tries == n+10 {
			return nil, fmt.Errorf("proctest: free port: only ports in %v were offered", avoid)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("proctest: free port: %w", err)
		}
		held = append(held, l)
		if port := l.Addr().(*net.TCPAddr).Port; !slices.Contains(avoid, port) {
			ports = append(ports, port)
		}
	}
	return ports, nil
}

// Missing ends a test whose server program is not installed: it fails
// when $CI is "true", where the program must be installed, and skips the
// test otherwise.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf(format+" (CI=true)", args...)
		return
	}
	t.Skipf(format, args...)
}

// Tail is an io.Writer that keeps the last bytes written to it: a
// server's output, to show when a test fails. It is safe for concurrent
// use.
type Tail struct {
	mu  sync.Mutex // guards following
	max int
	buf []byte
}

// NewTail returns a Tail that keeps the last max bytes.
func NewTail(max int) *Tail { return &Tail{max: max} }

// Write appends p, dropping the oldest bytes beyond the limit. It never
// fails.
func (t *Tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

// String returns the bytes kept.
func (t *Tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
