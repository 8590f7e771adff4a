// Tests of the watcher: the set it returns, across changes and outages.

package zk

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
)

func TestVisibleWithinOneSecond(t *testing.T) {
	provider, consumer := shared(t), shared(t)
	svc := serviceFor(t)
	w, err := consumer.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "empty at first")

	a := inst(svc, "20001")
	if err := provider.Register(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	took := waitSet(t, w, time.Second, "after Register", a)
	t.Logf("registration visible after %v", took)

	if err := provider.Deregister(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	took = waitSet(t, w, time.Second, "after Deregister")
	t.Logf("deregistration visible after %v", took)
}

// TestWatchReadsOnlyNewChildren: after a change, the watcher reads the
// data of the children that came alone; when a Register replaces an
// instance's data (its node deleted and created again under the same
// name) it reads them all, and the new data shows.
func TestWatchReadsOnlyNewChildren(t *testing.T) {
	provider, consumer := shared(t), shared(t)
	svc := serviceFor(t)
	a, b, c := inst(svc, "20001"), inst(svc, "20002"), inst(svc, "20003")
	for _, in := range []registry.Instance{a, b} {
		if err := provider.Register(ctxFor(t, 5*time.Second), in); err != nil {
			t.Fatal(err)
		}
	}
	reads := make(chan int, 16)
	setFetchHook(t, consumer, func(n int) { reads <- n })
	w, err := consumer.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "at first", a, b)
	if n := <-reads; n != 2 {
		t.Fatalf("the first load read %d children, want 2", n)
	}

	if err := provider.Register(ctxFor(t, 5*time.Second), c); err != nil {
		t.Fatal(err)
	}
	waitSet(t, w, time.Second, "after a Register", a, b, c)
	if n := <-reads; n != 1 {
		t.Errorf("the load after one Register read %d children, want 1", n)
	}

	b2 := b
	b2.Addr = "127.0.0.1:30002"
	if err := provider.Register(ctxFor(t, 5*time.Second), b2); err != nil {
		t.Fatal(err)
	}
	waitSet(t, w, time.Second, "after b's data was replaced", a, b2, c)
	all := false
	for !all {
		select {
		case n := <-reads:
			all = n == 3
		default:
			t.Fatal("no load read every child after a node was replaced")
		}
	}
}

// TestOutageKeepsLastSetAndRecovers: while ZooKeeper is down, for less
// than the session timeout, a watcher keeps its last set quietly and calls
// fail fast; when it is back the sessions resume and changes flow again.
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

	stopped := time.Now() // before: the client may see the end first
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
	if err := provider.waitSession(ctxFor(t, 10*time.Second), provider.sess.conn); err != nil {
		t.Fatalf("no session after the restart: %v", err)
	}
	t.Logf("session back %v after ZooKeeper restarted", time.Since(restarted))
	if err := provider.Register(ctxFor(t, 10*time.Second), b); err != nil {
		t.Fatalf("Register after the restart: %v", err)
	}
	// A restart slower than the session timeout makes the watcher report
	// the outage first.
	waitSetAcrossOutage(t, w, 5*time.Second, "after the restart", stopped, cfg.SessionTimeout, a, b)
	t.Logf("watcher saw a change %v after ZooKeeper restarted", time.Since(restarted))
	if err := provider.Deregister(ctxFor(t, 5*time.Second), a); err != nil {
		t.Fatal(err)
	}
	// Not the usual second: a restarted ZooKeeper may still expire a
	// restored session, after which the keeper restores b on a new one.
	waitSet(t, w, 5*time.Second, "deregister after the restart", b)
}

// waitSetAcrossOutage is waitSet for a watcher that may report the outage
// that began at down: an error wrapping registry.ErrUnavailable, once, and
// not before the session timeout.
func waitSetAcrossOutage(t *testing.T, w registry.Watcher, d time.Duration, step string, down time.Time, sessionTimeout time.Duration, want ...registry.Instance) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var last []registry.Instance
	reported := false
	for {
		got, err := w.Next(ctx)
		if errors.Is(err, registry.ErrUnavailable) && !reported {
			if since := time.Since(down); since < sessionTimeout {
				t.Fatalf("%s: the outage was reported %v after it began, before the session timeout (%v)", step, since, sessionTimeout)
			}
			reported = true
			continue
		}
		if err != nil {
			t.Fatalf("%s: watcher did not reach %v within %v (last: %v, outage reported: %v): %v", step, want, d, last, reported, err)
		}
		if registry.EqualSets(got, want) {
			return
		}
		last = got
	}
}

// TestWatcherReportsLongOutage: once the session has been down for the
// session timeout, Next returns an error wrapping registry.ErrUnavailable,
// once; when ZooKeeper is back it returns the full set again, although the
// set did not change.
func TestWatcherReportsLongOutage(t *testing.T) {
	srv := zktest.Start(t)
	const sessionTimeout = 2 * time.Second
	r := newRegistry(t, Config{Servers: []string{srv.Addr()}, SessionTimeout: sessionTimeout, RequestTimeout: 500 * time.Millisecond})
	w, err := r.Watch(ctxFor(t, 5*time.Second), serviceFor(t))
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	waitSet(t, w, time.Second, "before the outage")

	stopped := time.Now() // before: the client may see the end first
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), sessionTimeout+3*time.Second)
	got, err := w.Next(ctx)
	cancel()
	if !errors.Is(err, registry.ErrUnavailable) || !errors.Is(err, ErrNoSession) {
		t.Fatalf("Next with ZooKeeper down for %v = %v, %v; want an error wrapping ErrNoSession and registry.ErrUnavailable", time.Since(stopped), got, err)
	}
	if down := time.Since(stopped); down < sessionTimeout {
		t.Fatalf("the outage was reported after %v, before the session timeout (%v)", down, sessionTimeout)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 300*time.Millisecond)
	got, err = w.Next(ctx)
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next after the report, ZooKeeper still down = %v, %v; want the outage reported once (context.DeadlineExceeded)", got, err)
	}

	srv.Start(t)
	restarted := time.Now()
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	got, err = w.Next(ctx)
	cancel()
	if err != nil || len(got) != 0 {
		t.Fatalf("Next after the restart = %v, %v; want the full (empty) set again", got, err)
	}
	t.Logf("set returned %v after ZooKeeper restarted", time.Since(restarted))
}

// TestWatchKeepsSetSorted: across Registers and Deregisters, each set
// Next returns is sorted by ID and the caller's to change, and an instance
// that did not change keeps its Metadata map from one set to the next
// instead of a copy.
func TestWatchKeepsSetSorted(t *testing.T) {
	provider, consumer := shared(t), shared(t)
	svc := serviceFor(t)
	mk := func(id string) registry.Instance {
		in := inst(svc, id)
		in.Metadata = map[string]string{"zone": "z" + id}
		return in
	}
	a, b, c, d, e := mk("20001"), mk("20002"), mk("20003"), mk("20004"), mk("20005")
	for _, in := range []registry.Instance{e, a, c} {
		if err := provider.Register(ctxFor(t, 5*time.Second), in); err != nil {
			t.Fatal(err)
		}
	}
	w, err := consumer.Watch(ctxFor(t, 5*time.Second), svc)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	next := func(step string, want ...registry.Instance) []registry.Instance {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		for {
			got, err := w.Next(ctx)
			if err != nil {
				t.Fatalf("%s: watcher did not reach %v: %v", step, want, err)
			}
			if !registry.SortedByID(got) {
				t.Fatalf("%s: set not sorted by ID: %v", step, got)
			}
			if registry.EqualSets(got, want) {
				return got
			}
		}
	}
	first := next("at first", a, c, e)
	first[0].Addr = "changed by the caller"
	steps := []struct {
		what string
		do   func() error
		want []registry.Instance
	}{
		{"b registered", func() error { return provider.Register(ctxFor(t, 5*time.Second), b) }, []registry.Instance{a, b, c, e}},
		{"c deregistered", func() error { return provider.Deregister(ctxFor(t, 5*time.Second), c) }, []registry.Instance{a, b, e}},
		{"d registered", func() error { return provider.Register(ctxFor(t, 5*time.Second), d) }, []registry.Instance{a, b, d, e}},
	}
	prev := first
	for _, s := range steps {
		if err := s.do(); err != nil {
			t.Fatalf("%s: %v", s.what, err)
		}
		got := next(s.what, s.want...)
		if got[0].Addr != a.Addr {
			t.Fatalf("%s: a's address is %q: the caller's change reached the watcher", s.what, got[0].Addr)
		}
		if reflect.ValueOf(got[0].Metadata).UnsafePointer() != reflect.ValueOf(prev[0].Metadata).UnsafePointer() {
			t.Fatalf("%s: a's Metadata map was copied", s.what)
		}
		prev = got
	}
}
