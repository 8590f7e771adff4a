// Package zktest runs a real ZooKeeper server process for tests.
//
// One server per test:
//
//	srv := zktest.Start(t) // killed and removed when t ends
//	conn, _, _ := zk.Connect([]string{srv.Addr()}, 2*time.Second)
//	srv.Stop()  // an outage...
//	srv.Start(t) // ...and the recovery: same data directory, same port
//
// One server per test package, started by the first test that asks:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(zktest.WithShared(m)) }
//	func TestX(t *testing.T) { srv := zktest.Shared(t); ... }
//
// The server is ZooKeeperServerMain from the Debian package
// (apt-get install -y zookeeper): /usr/share/java/zookeeper.jar, whose
// manifest names its dependencies, run by java from PATH. $ZOOKEEPER_CLASSPATH
// replaces the class path. When java or the jar is missing the test is
// skipped, or fails when $CI is "true".
//
// The server listens on a free 127.0.0.1 port (never 2181), with tickTime
// 200 ms so that session timeouts from 400 ms to 60 s are accepted, and dies
// with the test binary.
package zktest

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/proctest"
	"github.com/go-zookeeper/zk"
)

const (
	// TickTime is the server's tick; the shortest session timeout it
	// grants is twice this.
	TickTime = 200 * time.Millisecond
	// readyTimeout bounds how long a server may take to answer ruok.
	readyTimeout = 30 * time.Second
	// logTailBytes is how much of the server's log failures show.
	logTailBytes = 4 << 10
)

// Default locations of the Debian package.
const (
	debianJar   = "/usr/share/java/zookeeper.jar"
	debianSLF4J = "/usr/share/java/slf4j-simple.jar" // optional: makes the server log
	debianCLI   = "/usr/share/zookeeper/bin/zkCli.sh"
)

// Server is one ZooKeeper server process.
type Server struct {
	java      string
	classpath string
	dir       string // holds zoo.cfg, data/ and server.log
	port      int
	proc      proctest.Process
	main      string // the server's main class; empty: ZooKeeperServerMain
}

// Start starts a server on a free port in a new temporary directory, waits
// until it answers, and arranges for it to be killed and its data removed
// when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	java, cp := install(t)
	s, err := newServer(java, cp)
	if err != nil {
		t.Fatalf("zktest: %v", err)
	}
	t.Cleanup(s.destroy)
	if err := s.start(); err != nil {
		t.Fatalf("zktest: %v", err)
	}
	return s
}

// StartWithTick is Start for a server whose tickTime is tick and whose
// session timeouts are bounded as ZooKeeper bounds them by default, by 2
// and 20 ticks (Start's accept 400 ms to 60 s).
func StartWithTick(t testing.TB, tick time.Duration) *Server {
	t.Helper()
	java, cp := install(t)
	ports, err := proctest.FreePorts(1, 2181)
	if err != nil {
		t.Fatalf("zktest: %v", err)
	}
	ms := int(tick / time.Millisecond)
	// Later lines of zoo.cfg override earlier ones.
	s, err := newConfigured(java, cp, ports[0], []string{
		"tickTime=" + strconv.Itoa(ms),
		"minSessionTimeout=" + strconv.Itoa(2*ms),
		"maxSessionTimeout=" + strconv.Itoa(20*ms),
	})
	if err != nil {
		t.Fatalf("zktest: %v", err)
	}
	t.Cleanup(s.destroy)
	if err := s.start(); err != nil {
		t.Fatalf("zktest: %v", err)
	}
	return s
}

var shared proctest.Shared[Server]

// Shared returns the package's shared server, starting it on first use. It
// lives until the wrapper from [WithShared] stops it after all tests (or,
// without it, until the test binary exits). Tests that stop or kill their
// server must use [Start] instead.
func Shared(t testing.TB) *Server {
	t.Helper()
	java, cp := install(t)
	s, err := shared.Get(func() (*Server, error) {
		s, err := newServer(java, cp)
		if err != nil {
			return nil, err
		}
		if err := s.start(); err != nil {
			s.destroy()
			return nil, err
		}
		return s, nil
	})
	if err != nil {
		t.Fatalf("zktest: shared server: %v", err)
	}
	return s
}

// WithShared wraps a testing.M so that running it also stops the shared
// server after the tests, before leak checks run:
//
//	goleak.VerifyTestMain(zktest.WithShared(m))
func WithShared(m interface{ Run() int }) interface{ Run() int } {
	return shared.Wrap(m, (*Server).destroy)
}

// install finds java and the server's class path, or ends the test.
func install(t testing.TB) (java, classpath string) {
	t.Helper()
	java, cp, err := lookup()
	if err != nil {
		proctest.Missing(t, "zookeeper not installed: apt-get install -y zookeeper (%v)", err)
	}
	return java, cp
}

func lookup() (java, classpath string, err error) {
	java, err = exec.LookPath("java")
	if err != nil {
		return "", "", fmt.Errorf("java not found on PATH: %w", err)
	}
	if cp := os.Getenv("ZOOKEEPER_CLASSPATH"); cp != "" {
		return java, cp, nil
	}
	if _, err := os.Stat(debianJar); err != nil {
		return "", "", fmt.Errorf("no ZooKeeper jar: %w", err)
	}
	cp := debianJar
	if _, err := os.Stat(debianSLF4J); err == nil {
		cp += string(os.PathListSeparator) + debianSLF4J
	}
	return java, cp, nil
}

func newServer(java, classpath string) (*Server, error) {
	ports, err := proctest.FreePorts(1, 2181) // never ZooKeeper's default
	if err != nil {
		return nil, err
	}
	return newConfigured(java, classpath, ports[0], nil)
}

// newConfigured makes a server for port whose zoo.cfg has extra lines
// after the common ones.
func newConfigured(java, classpath string, port int, extra []string) (*Server, error) {
	dir, err := os.MkdirTemp("", "zktest-")
	if err != nil {
		return nil, err
	}
	s := &Server{java: java, classpath: classpath, dir: dir, port: port}
	cfg := strings.Join(append([]string{
		"tickTime=" + strconv.Itoa(int(TickTime/time.Millisecond)),
		"minSessionTimeout=" + strconv.Itoa(int(2*TickTime/time.Millisecond)),
		"maxSessionTimeout=60000",
		"dataDir=" + filepath.Join(dir, "data"),
		"clientPortAddress=127.0.0.1",
		"clientPort=" + strconv.Itoa(port),
		"maxClientCnxns=0",
		// No fsync per write: tests share a busy disk, and data survives
		// Stop and Kill in the page cache.
		"forceSync=no",
		"admin.enableServer=false",
		"4lw.commands.whitelist=ruok,stat,srvr,cons",
	}, append(extra, "")...), "\n")
	if err := os.WriteFile(s.configPath(), []byte(cfg), 0o644); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return s, nil
}

func (s *Server) configPath() string { return filepath.Join(s.dir, "zoo.cfg") }
func (s *Server) logPath() string    { return filepath.Join(s.dir, "server.log") }

// Addr returns the client address, 127.0.0.1:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Dir returns the directory holding zoo.cfg, the data directory and the
// server's log.
func (s *Server) Dir() string { return s.dir }

// Start starts the server again after Stop or Kill, with the same data
// directory and port, and waits until it answers. It fails the test when
// the server does not come up.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("zktest: %v", err)
	}
}

// Stop stops the server gracefully (SIGTERM), killing it if it has not
// exited within 10 s, and waits for it to exit. Sessions and ephemeral
// nodes survive in the data directory for the next Start.
func (s *Server) Stop() { s.proc.Stop() }

// Kill kills the server (SIGKILL) and waits for it to exit.
func (s *Server) Kill() { s.proc.Kill() }

// Running reports whether the server process is running.
func (s *Server) Running() bool { return s.proc.Running() }

// Log returns the end of the server's log.
func (s *Server) Log() string {
	f, err := os.Open(s.logPath())
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > logTailBytes {
		if _, err := f.Seek(-logTailBytes, io.SeekEnd); err != nil {
			return fmt.Sprintf("(log: %v)", err)
		}
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return fmt.Sprintf("(log: %v)", err)
	}
	return string(b)
}

// CLIPath returns ZooKeeper's command-line shell as the Debian package
// installs it, or an error when it is missing.
func CLIPath() (string, error) {
	if _, err := os.Stat(debianCLI); err != nil {
		return "", fmt.Errorf("zktest: no zkCli.sh: %w", err)
	}
	return debianCLI, nil
}

// CLI runs ZooKeeper's shell (zkCli.sh) with one command against the
// server, e.g. CLI(ctx, "ls", "-R", "/services"), and returns its standard
// output. The shell also prints connection chatter; callers pick out the
// lines they need.
func (s *Server) CLI(ctx context.Context, args ...string) (string, error) {
	cli, err := CLIPath()
	if err != nil {
		return "", err
	}
	cmd := exec.CommandContext(ctx, cli, append([]string{"-server", s.Addr()}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("zktest: zkCli.sh %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

func (s *Server) start() error {
	if s.proc.Running() {
		return proctest.ErrRunning // before the log file is touched
	}
	logf, err := os.OpenFile(s.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer logf.Close() // the child holds its own descriptor
	cmd := exec.Command(s.java,
		"-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-cp", s.classpath,
		cmp.Or(s.main, "org.apache.zookeeper.server.ZooKeeperServerMain"), s.configPath())
	cmd.Dir = s.dir
	// An *os.File, not a buffer: exec starts no copying goroutines.
	cmd.Stdout, cmd.Stderr = logf, logf
	err = s.proc.Start(cmd, readyTimeout, func(context.Context) error { return s.probe() })
	if err != nil && !errors.Is(err, proctest.ErrRunning) {
		return fmt.Errorf("server on %s: %w\n--- server log (tail) ---\n%s", s.Addr(), err, s.Log())
	}
	return err
}

// probe sends ruok until the server answers imok, then srvr until it
// reports its mode: ruok is answered as soon as the port is open, srvr only
// once the server serves requests.
func (s *Server) probe() error {
	ok, err := FourLetter(s.Addr(), "ruok", time.Second)
	if err != nil {
		return err
	}
	if ok != "imok" {
		return fmt.Errorf("ruok answered %q", ok)
	}
	stat, err := FourLetter(s.Addr(), "srvr", time.Second)
	if err != nil {
		return err
	}
	if !strings.Contains(stat, "Mode: ") {
		return fmt.Errorf("srvr answered %q", strings.TrimSpace(stat))
	}
	return nil
}

// FourLetter sends one of ZooKeeper's four-letter commands (ruok, stat,
// srvr, cons) to addr and returns the answer.
func FourLetter(addr, cmd string, timeout time.Duration) (string, error) {
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(c)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// destroy kills the server and removes its directory.
func (s *Server) destroy() {
	s.Kill()
	os.RemoveAll(s.dir)
}

// Client connects a plain ZooKeeper client to addr, for a test to read the
// tree or write nodes of its own. It returns once the session is
// established, or ends the test after 5 s. The client is closed, and its
// goroutines finished, when the test ends.
func Client(t testing.TB, addr string) *zk.Conn {
	t.Helper()
	conn, events, err := zk.Connect([]string{addr}, 4*time.Second, zk.WithLogger(quietLog{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		for range events {
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-ctx.Done():
			t.Fatalf("zktest: no session with %s (state %v)", addr, conn.State())
		}
	}
	return conn
}

// quietLog drops the ZooKeeper client's log lines.
type quietLog struct{}

func (quietLog) Printf(string, ...any) {}
