package proctest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// shell returns a command running script with /bin/sh, or skips the test.
func shell(t *testing.T, script string) *exec.Cmd {
	t.Helper()
	sh, err := exec.LookPath("sh")
	if err != nil {
		t.Skipf("no sh: %v", err)
	}
	return exec.Command(sh, "-c", script)
}

func ready(context.Context) error { return nil }

// startProcess starts script as p and kills it when the test ends.
func startProcess(t *testing.T, p *Process, script string) {
	t.Helper()
	t.Cleanup(p.Kill)
	if err := p.Start(shell(t, script), 5*time.Second, ready); err != nil {
		t.Fatal(err)
	}
	if !p.Running() {
		t.Fatal("Running = false after Start")
	}
}

func TestStopKillRestart(t *testing.T) {
	tests := []struct {
		name string
		end  func(*Process)
	}{
		{"Stop", (*Process).Stop},
		{"Kill", (*Process).Kill},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Process
			startProcess(t, &p, "sleep 60")
			tt.end(&p)
			if p.Running() {
				t.Fatalf("Running = true after %s", tt.name)
			}
			tt.end(&p) // a second call is harmless
			startProcess(t, &p, "sleep 60")
		})
	}
}

func TestZeroProcessIsStopped(t *testing.T) {
	var p Process
	if p.Running() {
		t.Fatal("Running = true for a process never started")
	}
	p.Stop()
	p.Kill()
}

func TestStopKillsGroupIgnoringTerm(t *testing.T) {
	p := Process{stopAfter: 200 * time.Millisecond}
	t.Cleanup(p.Kill)
	// The shell and its sleeping child both ignore SIGTERM; the marker
	// file says the trap is set.
	marker := filepath.Join(t.TempDir(), "trapped")
	cmd := shell(t, `trap "" TERM; : > "$1"; sleep 60; exit 0`)
	cmd.Args = append(cmd.Args, "sh", marker)
	trapped := func(context.Context) error {
		_, err := os.Stat(marker)
		return err
	}
	if err := p.Start(cmd, 5*time.Second, trapped); err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	p.Stop()
	if p.Running() {
		t.Fatal("Running = true after Stop")
	}
	if d := time.Since(begin); d < 200*time.Millisecond {
		t.Fatalf("Stop returned after %v, before the stop timeout, though SIGTERM is ignored", d)
	}
}

func TestStartWhileRunningFails(t *testing.T) {
	var p Process
	startProcess(t, &p, "sleep 60")
	err := p.Start(shell(t, "sleep 60"), time.Second, ready)
	if !errors.Is(err, ErrRunning) {
		t.Fatalf("second Start = %v, want ErrRunning", err)
	}
	if !p.Running() {
		t.Fatal("the first process was disturbed")
	}
}

func TestStartNotReady(t *testing.T) {
	notYet := errors.New("not yet")
	tests := []struct {
		name   string
		script string
		want   error
		text   string
	}{
		{"exits", "exit 3", ErrExited, "not yet"},
		{"never ready", "sleep 60", notYet, "not ready within"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Process
			t.Cleanup(p.Kill)
			err := p.Start(shell(t, tt.script), 300*time.Millisecond, func(context.Context) error { return notYet })
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("Start = %v, want %v containing %q", err, tt.want, tt.text)
			}
			if p.Running() {
				t.Fatal("Running = true after a failed Start")
			}
		})
	}
}

// TestStartReadyThenExited: a process that becomes ready and exits
// between two checks was ready.
func TestStartReadyThenExited(t *testing.T) {
	var p Process
	t.Cleanup(p.Kill)
	var checks atomic.Int32
	cmd := shell(t, "exit 0")
	// The first check comes before the process can have exited; every
	// later one finds it ready, as a line the process printed would.
	ready := func(context.Context) error {
		if checks.Add(1) == 1 {
			return errors.New("not yet")
		}
		return nil
	}
	// A timeout far beyond the 50 ms poll: only the exit ends the wait
	// before a second poll.
	start := time.Now()
	if err := p.Start(cmd, time.Minute, ready); err != nil {
		t.Fatalf("Start = %v, want nil for a process that was ready when it exited", err)
	}
	if d := time.Since(start); d > 30*time.Second {
		t.Fatalf("Start took %v", d)
	}
}

func TestStartBadInput(t *testing.T) {
	tests := []struct {
		name    string
		cmd     *exec.Cmd
		timeout time.Duration
		ready   func(context.Context) error
	}{
		{"no command", nil, time.Second, ready},
		{"no check", exec.Command("true"), time.Second, nil},
		{"no timeout", exec.Command("true"), 0, ready},
		{"no program", exec.Command("/nonexistent/proctest-server"), time.Second, ready},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p Process
			if err := p.Start(tt.cmd, tt.timeout, tt.ready); err == nil || !strings.HasPrefix(err.Error(), "proctest: ") {
				t.Fatalf("Start = %v, want a proctest error", err)
			}
			if p.Running() {
				t.Fatal("Running = true after a failed Start")
			}
		})
	}
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(3)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(ports)
	if len(ports) != 3 || len(slices.Compact(slices.Clone(ports))) != 3 {
		t.Fatalf("FreePorts(3) = %v, want 3 distinct ports", ports)
	}
	// Avoid the ports just found: they are likely offered again.
	again, err := FreePorts(3, ports...)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range again {
		if slices.Contains(ports, p) {
			t.Fatalf("FreePorts(3, %v) = %v, which holds an avoided port", ports, again)
		}
	}
	for _, n := range []int{0, -1} {
		if _, err := FreePorts(n); err == nil {
			t.Errorf("FreePorts(%d) succeeded", n)
		}
	}
}

func TestTail(t *testing.T) {
	tests := []struct {
		writes []string
		want   string
	}{
		{nil, ""},
		{[]string{"abc"}, "abc"},
		{[]string{"abc", "defg"}, "efg"},
		{[]string{"abcdefgh"}, "fgh"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.writes, "+"), func(t *testing.T) {
			tail := NewTail(3)
			for _, w := range tt.writes {
				if n, err := tail.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write(%q) = %d, %v", w, n, err)
				}
			}
			if got := tail.String(); got != tt.want {
				t.Fatalf("String() = %q, want %q", got, tt.want)
			}
		})
	}
}

type server struct{ destroyed bool }

type runner int

func (r runner) Run() int { return int(r) }

func TestShared(t *testing.T) {
	var sh Shared[server]
	starts := 0
	start := func() (*server, error) { starts++; return &server{}, nil }
	a, errA := sh.Get(start)
	b, errB := sh.Get(start)
	if errA != nil || errB != nil || a != b || starts != 1 {
		t.Fatalf("Get twice = %p, %v and %p, %v after %d starts, want one server started once", a, errA, b, errB, starts)
	}
	if code := sh.Wrap(runner(3), func(s *server) { s.destroyed = true }).Run(); code != 3 {
		t.Fatalf("Run = %d, want 3", code)
	}
	if !a.destroyed {
		t.Fatal("Wrap did not destroy the shared server")
	}
}

func TestSharedKeepsError(t *testing.T) {
	tests := []struct {
		name  string
		start func() (*server, error)
	}{
		{"error", func() (*server, error) { return nil, errors.New("broken") }},
		{"no server", func() (*server, error) { return nil, nil }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var sh Shared[server]
			starts := 0
			start := func() (*server, error) { starts++; return tt.start() }
			for i := range 2 {
				if s, err := sh.Get(start); s != nil || err == nil {
					t.Fatalf("Get #%d = %v, %v, want an error", i, s, err)
				}
			}
			if starts != 1 {
				t.Fatalf("start called %d times, want once", starts)
			}
			destroyed := false
			sh.Wrap(runner(0), func(*server) { destroyed = true }).Run()
			if destroyed {
				t.Fatal("Wrap destroyed a server that never started")
			}
		})
	}
}

// fakeTB records how Missing ended a test.
type fakeTB struct {
	testing.TB
	ended string
}

func (f *fakeTB) Helper() {}
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.ended = "fail: " + fmt.Sprintf(format, args...)
}
func (f *fakeTB) Skipf(format string, args ...any) { f.ended = "skip: " + fmt.Sprintf(format, args...) }

func TestMissing(t *testing.T) {
	tests := []struct {
		ci, want string
	}{
		{"true", "fail: x not installed: 7 (CI=true)"},
		{"", "skip: x not installed: 7"},
		{"false", "skip: x not installed: 7"},
	}
	for _, tt := range tests {
		t.Run("CI="+tt.ci, func(t *testing.T) {
			t.Setenv("CI", tt.ci)
			var f fakeTB
			Missing(&f, "x not installed: %d", 7)
			if f.ended != tt.want {
				t.Fatalf("Missing ended the test with %q, want %q", f.ended, tt.want)
			}
		})
	}
}
