// Tests that every component logs through the logger the application gave.

package dabb_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
)

// TestLoggingStaysWithTheApplication: a server and a client that were
// given a logger, on a ZooKeeper and an etcd registry opened with it, log
// nothing to slog.Default through an outage of the registry. It runs in a
// process of its own, so no other test writes to slog.Default meanwhile.
func TestLoggingStaysWithTheApplication(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestLoggingProcess$", "-test.v")
	cmd.Env = append(os.Environ(), "DABB_LOGGING_PROCESS=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the logging process failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "logging process: done") {
		t.Fatalf("the logging process did not finish its checks:\n%s", out)
	}
}

// TestLoggingProcess is the process of TestLoggingStaysWithTheApplication;
// it does nothing in a normal run.
func TestLoggingProcess(t *testing.T) {
	if os.Getenv("DABB_LOGGING_PROCESS") == "" {
		t.Skip("runs only as the process of TestLoggingStaysWithTheApplication")
	}
	var stray lockedLog
	slog.SetDefault(slog.New(slog.NewTextHandler(&stray, nil)))
	for _, b := range []struct {
		name  string
		start func(t *testing.T) (url string, kill func(), restart func(testing.TB))
	}{
		{"etcd", func(t *testing.T) (string, func(), func(testing.TB)) {
			s := etcdtest.Start(t)
			return "etcd://" + s.Endpoint() + "/services?ttl=2s", s.Kill, s.Start
		}},
		{"zk", func(t *testing.T) (string, func(), func(testing.TB)) {
			s := zktest.Start(t)
			return "zk://" + s.Addr() + "/services?session_timeout=2s", s.Kill, s.Start
		}},
	} {
		t.Run(b.name, func(t *testing.T) {
			var app lockedLog
			appLog := slog.New(slog.NewTextHandler(&app, nil))
			url, kill, restart := b.start(t)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			open := func() registry.Registry {
				r, err := registry.Open(ctx, url, registry.WithLogger(appLog))
				if err != nil {
					t.Fatalf("open %s: %v", url, err)
				}
				t.Cleanup(func() { r.Close() })
				return r
			}
			startServer(t, newProbe(), dabb.WithRegistry(open()), dabb.WithLogger(appLog))
			c, err := proxy.NewClient(open(), proxy.WithLogger(appLog))
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			waitInstances(ctx, t, c, 1)
			kill()
			// The outage is over once both sessions or connections said so in
			// the application's log; then the registry comes back.
			for !strings.Contains(app.String(), "level=WARN") {
				select {
				case <-ctx.Done():
					t.Fatalf("the application's log says nothing of the outage:\n%s", app.String())
				case <-time.After(20 * time.Millisecond): // the log has no change event
				}
			}
			restart(t)
			if _, err := call(ctx, c, "echo"); err != nil {
				t.Fatalf("call after the outage: %v", err)
			}
		})
	}
	if s := stray.String(); s != "" {
		t.Fatalf("components logged to slog.Default despite the logger they were given:\n%s", s)
	}
	fmt.Println("logging process: done")
}

// lockedLog is a buffer that log handlers on many goroutines share.
type lockedLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
