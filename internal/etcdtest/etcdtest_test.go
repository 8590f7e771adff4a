package etcdtest_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/internal/etcdtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(etcdtest.WithShared(m))
}

func TestStopStartKeepsDataAndPorts(t *testing.T) {
	srv := etcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if !strings.HasPrefix(srv.Endpoint(), "127.0.0.1:") || strings.HasSuffix(srv.Endpoint(), ":2379") {
		t.Fatalf("Endpoint() = %q, want a free 127.0.0.1 port other than 2379", srv.Endpoint())
	}
	if _, err := srv.Ctl(ctx, "put", "/etcdtest/k", "v1"); err != nil {
		t.Fatal(err)
	}
	endpoint := srv.Endpoint()

	srv.Stop()
	if srv.Running() {
		t.Fatal("Running() = true after Stop")
	}
	if _, err := srv.Ctl(ctx, "--dial-timeout=300ms", "--command-timeout=500ms", "get", "/etcdtest/k"); err == nil {
		t.Fatal("etcdctl get succeeded while the server was stopped")
	}

	srv.Start(t)
	if srv.Endpoint() != endpoint {
		t.Fatalf("endpoint after restart = %s, want %s", srv.Endpoint(), endpoint)
	}
	out, err := srv.Ctl(ctx, "get", "--print-value-only", "/etcdtest/k")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimSpace(string(out)); got != "v1" {
		t.Fatalf("value after restart = %q, want v1", got)
	}

	srv.Kill()
	if srv.Running() {
		t.Fatal("Running() = true after Kill")
	}
	srv.Start(t)
	if !srv.Running() {
		t.Fatal("Running() = false after a restart following Kill")
	}
}

func TestSharedIsShared(t *testing.T) {
	a, b := etcdtest.Shared(t), etcdtest.Shared(t)
	if a != b {
		t.Fatalf("Shared returned two servers: %s and %s", a.Endpoint(), b.Endpoint())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := a.Ctl(ctx, "endpoint", "health"); err != nil {
		t.Fatal(err)
	}
}
