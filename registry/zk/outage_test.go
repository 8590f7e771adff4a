package zk

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
)

// TestOutageKeepsLastSetAndRecovers: while ZooKeeper is down a watcher
// keeps its last set and calls fail fast; when it is back the sessions
// resume and changes flow again.
func TestOutageKeepsLastSetAndRecovers(t *testing.T) {
	srv := zktest.Start(t)
	const requestTimeout = 500 * time.Millisecond
	// A connection the restarting server accepts before it serves stalls
	// for the handshake cap, the session timeout here.
	cfg := Config{Servers: []string{srv.Addr()}, SessionTimeout: 4 * time.Second, RequestTimeout: requestTimeout}
	provider, consumer := newRegistry(t, cfg), newRegistry(t, cfg)
	svc := serviceFor(t)
	a, b := inst(svc, "20001"), inst(svc, "20002")
	if err := provider.Register(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	w, err := consumer.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "before the outage", a)

	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	got, err := w.Next(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("during the outage Next returned %v, %v; want no change (context.DeadlineExceeded)", got, err)
	}
	start := time.Now()
	err = provider.Register(context.Background(), b)
	// The slack covers scheduling on a loaded machine; a hang would take
	// forever.
	if took := time.Since(start); err == nil || took > requestTimeout+1500*time.Millisecond {
		t.Fatalf("Register during the outage: err = %v after %v; want an error within %v", err, took, requestTimeout)
	}
	if !errors.Is(err, ErrNoSession) {
		t.Fatalf("Register during the outage: err = %v, want ErrNoSession", err)
	}

	srv.Start(t)
	restarted := time.Now()
	// Calls are bounded by RequestTimeout; give the client time to notice
	// the server is back.
	if err := provider.waitSession(ctxFor(t, 10*time.Second), provider.conn); err != nil {
		t.Fatalf("no session after the restart: %v", err)
	}
	t.Logf("session back %v after ZooKeeper restarted", time.Since(restarted))
	if err := provider.Register(ctxFor(t, 10*time.Second), b); err != nil {
		t.Fatalf("Register after the restart: %v", err)
	}
	waitSet(t, w, 5*time.Second, "after the restart", a, b)
	t.Logf("watcher saw a change %v after ZooKeeper restarted", time.Since(restarted))
	if err := provider.Deregister(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	// Not the usual second: a restarted ZooKeeper may still expire a
	// restored session, after which the keeper restores b on a new one.
	waitSet(t, w, 5*time.Second, "deregister after the restart", b)
}
