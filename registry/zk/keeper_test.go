// Tests of the keeper, and the provider process the process tests run.

package zk

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/go-zookeeper/zk"
)

// TestReplacesNodeOfOldSession: a node left under our instance ID by
// another session (a previous process) is taken over at once.
func TestReplacesNodeOfOldSession(t *testing.T) {
	srv := zktest.Shared(t)
	old, r := shared(t), shared(t)
	svc := serviceFor(t)
	a := inst(svc, "20001")
	if err := old.Register(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	b := a
	b.Metadata = map[string]string{"generation": "2"}
	if err := r.Register(ctxFor(t, 5*time.Second), b); err != nil {
		t.Fatal(err)
	}
	data, stat, err := rawConn(t, srv.Addr()).Get(r.NodePath(svc, a.ID))
	if err != nil {
		t.Fatal(err)
	}
	if stat.EphemeralOwner != r.sess.conn.SessionID() {
		t.Fatalf("ephemeralOwner = %#x, want the new session %#x (old %#x)", stat.EphemeralOwner, r.sess.conn.SessionID(), old.sess.conn.SessionID())
	}
	if !strings.Contains(string(data), `"generation":"2"`) {
		t.Fatalf("node holds %s, want the new instance", data)
	}
	// The old owner's Deregister must not remove the new owner's node.
	if err := old.Deregister(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := rawConn(t, srv.Addr()).Exists(r.NodePath(svc, a.ID)); err != nil || !ok {
		t.Fatalf("the old owner's Deregister removed the new owner's node (%v, %v)", ok, err)
	}
}

// TestMultiReportsFailingOp: a failed transaction reports the error of the
// operation that failed, which ensure relies on to retry.
func TestMultiReportsFailingOp(t *testing.T) {
	conn := rawConn(t, zktest.Shared(t).Addr())
	p := "/multi-test-" + time.Now().Format("150405.000000")
	if _, err := conn.Create(p, []byte("x"), zk.FlagEphemeral, zk.WorldACL(zk.PermAll)); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		ops  []any
		want error
	}{
		{"BadVersion", []any{
			&zk.DeleteRequest{Path: p, Version: 7},
			&zk.CreateRequest{Path: p, Data: []byte("y"), Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
		}, zk.ErrBadVersion},
		{"NodeExists", []any{
			&zk.CreateRequest{Path: p + "-other", Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
			&zk.CreateRequest{Path: p, Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
		}, zk.ErrNodeExists},
		{"Replace", []any{
			&zk.DeleteRequest{Path: p, Version: 0},
			&zk.CreateRequest{Path: p, Data: []byte("y"), Acl: zk.WorldACL(zk.PermAll), Flags: zk.FlagEphemeral},
		}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := multi(conn, tt.ops...); !errors.Is(err, tt.want) {
				t.Fatalf("multi = %v, want %v", err, tt.want)
			}
		})
	}
	if data, _, err := conn.Get(p); err != nil || string(data) != "y" {
		t.Fatalf("after the transactions %s = %q, %v; want %q", p, data, err, "y")
	}
	if ok, _, _ := conn.Exists(p + "-other"); ok {
		t.Fatal("a failed transaction left its first operation applied")
	}
}

// The provider is this test binary run again with providerEnv set: it
// registers one instance and prints "session=<id>" each time its node is
// in place on a new session, until its standard input closes.
const (
	providerEnv            = "DABB_ZK_TEST_PROVIDER" // the server's address
	providerServiceEnv     = "DABB_ZK_TEST_PROVIDER_SERVICE"
	providerIDEnv          = "DABB_ZK_TEST_PROVIDER_ID"
	providerSessionTimeout = 2 * time.Second
)

func runProvider() int {
	addr, svc, id := os.Getenv(providerEnv), os.Getenv(providerServiceEnv), os.Getenv(providerIDEnv)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	r, err := New(Config{
		Servers:        []string{addr},
		SessionTimeout: providerSessionTimeout,
		RequestTimeout: 5 * time.Second,
		Logger:         log.With("process", "provider"),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		return 1
	}
	in := inst(svc, id)
	p := r.NodePath(svc, id)
	var mu sync.Mutex
	var last int64
	report := func(session int64) {
		mu.Lock()
		defer mu.Unlock()
		if session != 0 && session != last {
			last = session
			fmt.Printf("session=%d\n", session)
		}
	}
	setSessionHook(nil, r, func(session int64) {
		if _, ok := r.owns(p); ok {
			report(session)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := r.Register(ctx, in); err != nil {
		fmt.Fprintln(os.Stderr, "provider:", err)
		return 1
	}
	report(r.sess.conn.SessionID())
	io.Copy(io.Discard, os.Stdin) // until the test is done with us
	r.Close()
	return 0
}
