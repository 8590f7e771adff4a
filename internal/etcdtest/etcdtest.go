// Package etcdtest runs a real etcd server process for tests.
//
// One server per test:
//
//	srv := etcdtest.Start(t) // stopped and removed when t ends
//	cli, _ := clientv3.New(clientv3.Config{Endpoints: []string{srv.Endpoint()}})
//	srv.Stop()  // an outage...
//	srv.Start() // ...and the recovery: same data, same ports
//
// One server per test package, started by the first test that asks:
//
//	func TestMain(m *testing.M) { goleak.VerifyTestMain(etcdtest.WithShared(m)) }
//	func TestX(t *testing.T) { srv := etcdtest.Shared(t); ... }
//
// The binary is $ETCD_BIN, or etcd on PATH. When it is missing the test is
// skipped, or fails when $CI is "true". The server listens on free
// 127.0.0.1 ports only and dies with the test binary.
package etcdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const (
	// readyTimeout bounds how long a server may take to report healthy.
	readyTimeout = 15 * time.Second
	// stopTimeout bounds a graceful stop before the process is killed.
	stopTimeout = 10 * time.Second
	// logTail is how much of the server's output is kept for failures.
	logTail = 16 << 10
)

// Server is one etcd server process.
type Server struct {
	bin        string
	dir        string
	name       string
	clientPort int
	peerPort   int

	mu   sync.Mutex // guards following
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	log  *tail
}

// Start starts a server on free ports in a new temporary data directory,
// waits until it is healthy and arranges for it to be killed and its data
// removed when the test ends.
func Start(t testing.TB) *Server {
	t.Helper()
	bin := binary(t)
	s, err := newServer(bin)
	if err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	t.Cleanup(s.destroy)
	if err := s.start(); err != nil {
		t.Fatalf("etcdtest: %v", err)
	}
	return s
}

var shared struct {
	mu  sync.Mutex // guards following
	srv *Server
	err error
}

// Shared returns the package's shared server, starting it on first use.
// It lives until the wrapper from [WithShared] stops it after all tests
// (or, without it, until the test binary exits). Tests that stop or kill
// their server must use [Start] instead.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin := binary(t)
	shared.mu.Lock()
	defer shared.mu.Unlock()
	if shared.srv == nil && shared.err == nil {
		s, err := newServer(bin)
		if err == nil {
			if err = s.start(); err != nil {
				s.destroy()
			}
		}
		if err != nil {
			shared.err = err
		} else {
			shared.srv = s
		}
	}
	if shared.err != nil {
		t.Fatalf("etcdtest: shared server: %v", shared.err)
	}
	return shared.srv
}

// WithShared wraps a testing.M so that running it also stops the shared
// server after the tests, before leak checks run:
//
//	goleak.VerifyTestMain(etcdtest.WithShared(m))
func WithShared(m interface{ Run() int }) interface{ Run() int } {
	return runFunc(func() int {
		code := m.Run()
		shared.mu.Lock()
		if shared.srv != nil {
			shared.srv.destroy()
			shared.srv = nil
		}
		shared.mu.Unlock()
		return code
	})
}

type runFunc func() int

func (f runFunc) Run() int { return f() }

// binary finds the etcd binary or ends the test.
func binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("ETCD_BIN"); bin != "" {
		return bin
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("etcd not installed (CI=true): apt-get install -y etcd-server, or set ETCD_BIN")
		}
		t.Skip("etcd not installed: apt-get install -y etcd-server")
	}
	return bin
}

// Ctl runs etcdctl (v3 API) against the server and returns its standard
// output. The binary is $ETCDCTL_BIN, or etcdctl on PATH.
func (s *Server) Ctl(ctx context.Context, args ...string) ([]byte, error) {
	bin := os.Getenv("ETCDCTL_BIN")
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("etcdctl"); err != nil {
			return nil, fmt.Errorf("etcdtest: etcdctl not installed (apt-get install -y etcd-client): %w", err)
		}
	}
	cmd := exec.CommandContext(ctx, bin, append([]string{"--endpoints=" + s.Endpoint(), "--dial-timeout=2s", "--command-timeout=5s"}, args...)...)
	cmd.Env = append(os.Environ(), "ETCDCTL_API=3")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("etcdtest: etcdctl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return out, nil
}

func newServer(bin string) (*Server, error) {
	ports, err := freePorts(2)
	if err != nil {
		return nil, err
	}
	base := ""
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		base = "/dev/shm" // a RAM disk makes etcd's fsyncs cheap
	}
	dir, err := os.MkdirTemp(base, "etcdtest-")
	if err != nil {
		if dir, err = os.MkdirTemp("", "etcdtest-"); err != nil {
			return nil, fmt.Errorf("data dir: %w", err)
		}
	}
	return &Server{
		bin:        bin,
		dir:        dir,
		name:       "etcdtest" + strconv.Itoa(ports[0]),
		clientPort: ports[0],
		peerPort:   ports[1],
	}, nil
}

// freePorts returns n distinct ports free on 127.0.0.1 at the moment.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("free port: %w", err)
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// Endpoint returns the client address, host:port.
func (s *Server) Endpoint() string {
	return "127.0.0.1:" + strconv.Itoa(s.clientPort)
}

// URL returns the client URL, http://host:port.
func (s *Server) URL() string {
	return "http://" + s.Endpoint()
}

// Dir returns the data directory.
func (s *Server) Dir() string { return s.dir }

// Start starts the server again after Stop or Kill, with the same data
// directory and ports, and waits until it is healthy. It fails the test
// when the server does not come up.
func (s *Server) Start(t testing.TB) {
	t.Helper()
	if err := s.start(); err != nil {
		t.Fatalf("etcdtest: restart: %v", err)
	}
}

// Stop stops the server gracefully (SIGTERM), killing it if it has not
// exited within 10 s, and waits for it to exit.
func (s *Server) Stop() {
	s.signal(syscall.SIGTERM)
}

// Kill kills the server (SIGKILL) and waits for it to exit.
func (s *Server) Kill() {
	s.signal(syscall.SIGKILL)
}

// Running reports whether the server process is running.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done == nil {
		return false
	}
	select {
	case <-s.done:
		return false
	default:
		return true
	}
}

// Log returns the end of the server's output.
func (s *Server) Log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.log == nil {
		return ""
	}
	return s.log.String()
}

func (s *Server) start() error {
	s.mu.Lock()
	if s.done != nil {
		select {
		case <-s.done:
		default:
			s.mu.Unlock()
			return errors.New("server already running")
		}
	}
	client := "http://127.0.0.1:" + strconv.Itoa(s.clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(s.peerPort)
	cmd := exec.Command(s.bin,
		"--name="+s.name,
		"--data-dir="+s.dir,
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster="+s.name+"="+peer,
		"--initial-cluster-state=new",
		"--initial-cluster-token="+s.name,
		"--heartbeat-interval=50",
		"--election-timeout=500",
		"--logger=zap",
		"--log-outputs=stderr",
		"--log-level=warn",
	)
	log := &tail{max: logTail}
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = time.Second
	if err := cmd.Start(); err != nil {
		s.mu.Unlock()
		return fmt.Errorf("start %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	s.cmd, s.done, s.log = cmd, done, log
	s.mu.Unlock()
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	if err := s.waitReady(done); err != nil {
		s.Kill()
		return fmt.Errorf("%w\n--- etcd log tail ---\n%s", err, log.String())
	}
	return nil
}

// waitReady polls /health until it reports {"health":"true"}.
func (s *Server) waitReady(exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	url := s.URL() + "/health"
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		last = health(ctx, hc, url)
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("etcd exited before it was healthy (last check: %v)", last)
		case <-ctx.Done():
			return fmt.Errorf("etcd not healthy after %v: %v", readyTimeout, last)
		case <-tick.C:
		}
	}
}

func health(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if err != nil {
		return err
	}
	var h struct {
		Health string `json:"health"`
	}
	if err := json.Unmarshal(body, &h); err != nil {
		return fmt.Errorf("health: %s: %w", body, err)
	}
	if h.Health != "true" {
		return fmt.Errorf("health: %s", body)
	}
	return nil
}

// signal sends sig to the server's process group and waits for it to
// exit, killing it after stopTimeout.
func (s *Server) signal(sig syscall.Signal) {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.mu.Unlock()
	if cmd == nil || cmd.Process == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	select {
	case <-done:
	case <-time.After(stopTimeout):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// destroy kills the server and removes its data.
func (s *Server) destroy() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex // guards following
	max int
	buf []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}
