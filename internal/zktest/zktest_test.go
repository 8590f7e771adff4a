package zktest

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(WithShared(m)) }

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// connect opens a client session and closes it when the test ends, waiting
// for the client's goroutines to finish.
func connect(t *testing.T, addr string) *zk.Conn {
	t.Helper()
	conn, events, err := zk.Connect([]string{addr}, 2*time.Second, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		for range events { // closed when the client's loop has ended
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for conn.State() != zk.StateHasSession {
		select {
		case <-events:
		case <-ctx.Done():
			t.Fatalf("no session with %s: state %v", addr, conn.State())
		}
	}
	return conn
}

func TestStartAnswersAndListensOnLoopback(t *testing.T) {
	s := Start(t)
	host, port, err := net.SplitHostPort(s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if host != "127.0.0.1" || port == "2181" {
		t.Fatalf("Addr = %s, want 127.0.0.1 and a port other than 2181", s.Addr())
	}
	if !s.Running() {
		t.Fatal("Running = false after Start")
	}
	tests := []struct {
		cmd, want string
	}{
		{"ruok", "imok"},
		{"srvr", "Zookeeper version: 3."},
		{"stat", "Mode: standalone"},
	}
	for _, tt := range tests {
		t.Run(tt.cmd, func(t *testing.T) {
			got, err := FourLetter(s.Addr(), tt.cmd, 2*time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(got, tt.want) {
				t.Fatalf("%s answered %q, want it to contain %q", tt.cmd, got, tt.want)
			}
		})
	}
}

func TestStopStartKeepsDataAndPort(t *testing.T) {
	s := Start(t)
	addr := s.Addr()
	conn := connect(t, addr)
	if _, err := conn.Create("/kept", []byte("v1"), 0, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}

	s.Stop()
	if s.Running() {
		t.Fatal("Running = true after Stop")
	}
	if _, err := FourLetter(addr, "ruok", 500*time.Millisecond); err == nil {
		t.Fatal("ruok answered after Stop")
	}

	s.Start(t)
	if s.Addr() != addr {
		t.Fatalf("Addr after restart = %s, want %s", s.Addr(), addr)
	}
	data, _, err := connect(t, addr).Get("/kept")
	if err != nil {
		t.Fatalf("Get /kept after restart: %v", err)
	}
	if string(data) != "v1" {
		t.Fatalf("/kept = %q after restart, want %q", data, "v1")
	}
}

func TestKill(t *testing.T) {
	s := Start(t)
	s.Kill()
	if s.Running() {
		t.Fatal("Running = true after Kill")
	}
	if _, err := FourLetter(s.Addr(), "ruok", 500*time.Millisecond); err == nil {
		t.Fatal("ruok answered after Kill")
	}
	s.Kill() // a second Kill is harmless
}

func TestStartWhileRunningFails(t *testing.T) {
	s := Start(t)
	if err := s.start(); err == nil {
		t.Fatal("start on a running server succeeded")
	}
	if !s.Running() {
		t.Fatal("the first process was disturbed")
	}
}

func TestSharedIsShared(t *testing.T) {
	a, b := Shared(t), Shared(t)
	if a != b {
		t.Fatal("Shared returned two servers")
	}
	if got, err := FourLetter(a.Addr(), "ruok", 2*time.Second); err != nil || got != "imok" {
		t.Fatalf("ruok = %q, %v", got, err)
	}
}

func TestCLI(t *testing.T) {
	if _, err := CLIPath(); err != nil {
		t.Skip(err)
	}
	s := Shared(t)
	conn := connect(t, s.Addr())
	if _, err := conn.Create("/cli-check", []byte("hello"), 0, zk.WorldACL(zk.PermAll)); err != nil && err != zk.ErrNodeExists {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := s.CLI(ctx, "get", "/cli-check")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "\nhello\n") {
		t.Fatalf("zkCli.sh get /cli-check printed:\n%s\nwant a line %q", out, "hello")
	}
}

func TestBrokenClasspathFailsWithLog(t *testing.T) {
	java, _, err := lookup()
	if err != nil {
		t.Skip(err)
	}
	s, err := newServer(java, "/nonexistent.jar")
	if err != nil {
		t.Fatal(err)
	}
	defer s.destroy()
	err = s.start()
	if err == nil {
		t.Fatal("start with a broken class path succeeded")
	}
	if !strings.Contains(err.Error(), "ZooKeeperServerMain") {
		t.Fatalf("error does not show the log tail naming the missing class: %v", err)
	}
}
