// Tests of the keeper with a provider process of its own, killed and frozen.

//go:build linux

package zk

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
)

// provider is a child process that registers one instance.
type provider struct {
	cmd   *exec.Cmd
	lines chan string // its standard output, closed at EOF
}

func startProvider(t *testing.T, addr, svc, id string) *provider {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(),
		providerEnv+"="+addr, providerServiceEnv+"="+svc, providerIDEnv+"="+id)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	logPath := filepath.Join(t.TempDir(), "provider.log")
	logf, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stderr = logf
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &provider{cmd: cmd, lines: make(chan string, 64)}
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		defer close(p.lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
	}()
	t.Cleanup(func() {
		stdin.Close()
		cmd.Process.Kill()
		<-scanned
		cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("provider's log:\n%s", b)
		}
	})
	return p
}

// nextSession waits for the provider to report its node on a new session.
func (p *provider) nextSession(t *testing.T, d time.Duration) int64 {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case line, ok := <-p.lines:
			if !ok {
				t.Fatal("provider exited without reporting a session")
			}
			if v, found := strings.CutPrefix(line, "session="); found {
				id, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					t.Fatalf("provider printed %q", line)
				}
				return id
			}
		case <-timer.C:
			t.Fatalf("provider reported no new session within %v", d)
		}
	}
}

func (p *provider) signal(t *testing.T, sig syscall.Signal) {
	t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		t.Fatalf("signal %v: %v", sig, err)
	}
}

// TestKilledProviderDisappears: a provider killed with SIGKILL cannot
// deregister; its node goes with its session.
func TestKilledProviderDisappears(t *testing.T) {
	srv := zktest.Shared(t)
	consumer := shared(t)
	svc := serviceFor(t)
	a := inst(svc, "20001")
	w, err := consumer.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "before the provider starts")

	p := startProvider(t, srv.Addr(), svc, a.ID)
	p.nextSession(t, 20*time.Second)
	waitSet(t, w, time.Second, "provider registered", a)

	p.signal(t, syscall.SIGKILL)
	took := waitSet(t, w, providerSessionTimeout+2*time.Second, "after SIGKILL")
	t.Logf("killed provider gone from the watcher after %v (session timeout %v)", took, providerSessionTimeout)
}

// TestSessionExpiryReRegisters: a provider frozen longer than its session
// timeout loses its session and node; once it runs again it registers
// again on its own, on a new session.
func TestSessionExpiryReRegisters(t *testing.T) {
	srv := zktest.Shared(t)
	consumer := shared(t)
	raw := rawConn(t, srv.Addr())
	svc := serviceFor(t)
	a := inst(svc, "20001")
	nodePath := consumer.NodePath(svc, a.ID)
	w, err := consumer.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	p := startProvider(t, srv.Addr(), svc, a.ID)
	first := p.nextSession(t, 20*time.Second)
	waitSet(t, w, time.Second, "provider registered", a)
	if _, stat, err := raw.Get(nodePath); err != nil || stat.EphemeralOwner != first {
		t.Fatalf("before the freeze: Get(%s) = %v, owner %#x; want owner %#x", nodePath, err, stat.EphemeralOwner, first)
	}

	p.signal(t, syscall.SIGSTOP)
	took := waitSet(t, w, providerSessionTimeout+3*time.Second, "provider frozen: its session expires")
	t.Logf("frozen provider's session expired after %v", took)

	p.signal(t, syscall.SIGCONT)
	resumed := time.Now()
	const bound = 5 * time.Second
	second := p.nextSession(t, bound)
	if second == first {
		t.Fatalf("provider reported its old session %#x again", first)
	}
	_, stat, err := raw.Get(nodePath)
	if err != nil {
		t.Fatalf("after the new session: Get(%s): %v", nodePath, err)
	}
	if stat.EphemeralOwner != second {
		t.Fatalf("%s: ephemeralOwner = %#x, want the new session %#x (old %#x)", nodePath, stat.EphemeralOwner, second, first)
	}
	waitSet(t, w, bound-time.Since(resumed), "provider resumed", a)
	t.Logf("provider registered again on session %#x (was %#x) %v after SIGCONT", second, first, time.Since(resumed))
}
