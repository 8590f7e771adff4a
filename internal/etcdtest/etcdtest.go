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
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/proctest"
)

const (
	// readyTimeout bounds how long a server may take to report healthy.
	readyTimeout = 15 * time.Second
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
	proc       proctest.Process
	log        atomic.Pointer[proctest.Tail] // the output of the latest start
	// cluster and token, when set, make the server a member of a
	// cluster (StartCluster): its --initial-cluster and its token.
	cluster, token string
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

var shared proctest.Shared[Server]

// Shared returns the package's shared server, starting it on first use.
// It lives until the wrapper from [WithShared] stops it after all tests
// (or, without it, until the test binary exits). Tests that stop or kill
// their server must use [Start] instead.
func Shared(t testing.TB) *Server {
	t.Helper()
	bin := binary(t)
	s, err := shared.Get(func() (*Server, error) {
		s, err := newServer(bin)
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
		t.Fatalf("etcdtest: shared server: %v", err)
	}
	return s
}

// WithShared wraps a testing.M so that running it also stops the shared
// server after the tests, before leak checks run:
//
//	goleak.VerifyTestMain(etcdtest.WithShared(m))
func WithShared(m interface{ Run() int }) interface{ Run() int } {
	return shared.Wrap(m, (*Server).destroy)
}

// binary finds the etcd binary or ends the test.
func binary(t testing.TB) string {
	t.Helper()
	if bin := os.Getenv("ETCD_BIN"); bin != "" {
		return bin
	}
	bin, err := exec.LookPath("etcd")
	if err != nil {
		proctest.Missing(t, "etcd not installed: apt-get install -y etcd-server, or set ETCD_BIN")
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
	ports, err := proctest.FreePorts(2, 2379, 2380) // never etcd's defaults
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
func (s *Server) Stop() { s.proc.Stop() }

// Kill kills the server (SIGKILL) and waits for it to exit.
func (s *Server) Kill() { s.proc.Kill() }

// Running reports whether the server process is running.
func (s *Server) Running() bool { return s.proc.Running() }

// Log returns the end of the server's output.
func (s *Server) Log() string {
	if log := s.log.Load(); log != nil {
		return log.String()
	}
	return ""
}

func (s *Server) start() error {
	client := "http://127.0.0.1:" + strconv.Itoa(s.clientPort)
	peer := "http://127.0.0.1:" + strconv.Itoa(s.peerPort)
	cluster, token := s.name+"="+peer, s.name
	if s.cluster != "" {
		cluster, token = s.cluster, s.token
	}
	cmd := exec.Command(s.bin,
		"--name="+s.name,
		"--data-dir="+s.dir,
		"--listen-client-urls="+client,
		"--advertise-client-urls="+client,
		"--listen-peer-urls="+peer,
		"--initial-advertise-peer-urls="+peer,
		"--initial-cluster="+cluster,
		"--initial-cluster-state=new",
		"--initial-cluster-token="+token,
		"--heartbeat-interval=50",
		"--election-timeout=500",
		"--logger=zap",
		"--log-outputs=stderr",
		"--log-level=warn",
	)
	log := proctest.NewTail(logTail)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.WaitDelay = time.Second // the copying goroutines end soon after etcd
	hc := &http.Client{Timeout: time.Second}
	url := s.URL() + "/health"
	err := s.proc.Start(cmd, readyTimeout, func(ctx context.Context) error { return health(ctx, hc, url) })
	if errors.Is(err, proctest.ErrRunning) {
		return err
	}
	s.log.Store(log)
	if err != nil {
		return fmt.Errorf("etcd: %w\n--- etcd log tail ---\n%s", err, log.String())
	}
	return nil
}

// health reports whether /health at url says {"health":"true"}.
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

// destroy kills the server and removes its data.
func (s *Server) destroy() {
	s.Kill()
	_ = os.RemoveAll(s.dir)
}
