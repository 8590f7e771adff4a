// Tests of the guard: our nodes come back when others delete or change them.

package zk

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"path"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
	"github.com/go-zookeeper/zk"
)

// awaitNode waits, by watching it with raw, until p exists and returns its
// data and stat.
func awaitNode(t *testing.T, raw *zk.Conn, p string, d time.Duration, step string) ([]byte, *zk.Stat) {
	t.Helper()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		ok, _, ch, err := raw.ExistsW(p)
		if err != nil {
			t.Fatalf("%s: ExistsW %s: %v", step, p, err)
		}
		if ok {
			data, stat, err := raw.Get(p)
			if err == nil {
				return data, stat
			}
			continue // gone again: watch once more
		}
		select {
		case <-ch:
		case <-timer.C:
			t.Fatalf("%s: %s was not re-created within %v", step, p, d)
		}
	}
}

// staysGone checks, by watching it with raw, that p does not exist and is
// not created within d.
func staysGone(t *testing.T, raw *zk.Conn, p string, d time.Duration, step string) {
	t.Helper()
	ok, stat, ch, err := raw.ExistsW(p)
	if err != nil {
		t.Fatalf("%s: ExistsW %s: %v", step, p, err)
	}
	if ok {
		t.Fatalf("%s: %s exists (owner %#x); want it gone", step, p, stat.EphemeralOwner)
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case ev := <-ch:
		t.Fatalf("%s: %s changed (%v) within %v; want it to stay gone", step, p, ev.Type, d)
	case <-timer.C:
	}
}

// checkOurs checks that data and stat are those of r's node for in.
func checkOurs(t *testing.T, r *Registry, in registry.Instance, data []byte, stat *zk.Stat, step string) {
	t.Helper()
	if want := r.sess.conn.SessionID(); stat.EphemeralOwner != want {
		t.Fatalf("%s: ephemeralOwner = %#x, want the registry's session %#x", step, stat.EphemeralOwner, want)
	}
	var got registry.Instance
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatalf("%s: node holds %q: %v", step, data, err)
	}
	if !registry.EqualSets([]registry.Instance{got}, []registry.Instance{in}) {
		t.Fatalf("%s: node holds %+v, want %+v", step, got, in)
	}
}

// TestRecreatesDeletedNode: a node someone else deletes while our session
// lives is back within two seconds, in our session, with our data, every
// time, even when its service node went with it.
func TestRecreatesDeletedNode(t *testing.T) {
	srv := zktest.Shared(t)
	raw := rawConn(t, srv.Addr())
	tests := []struct {
		name   string
		delete func(t *testing.T, p string)
	}{
		{"Node", func(t *testing.T, p string) {
			if err := raw.Delete(p, -1); err != nil {
				t.Fatalf("Delete %s: %v", p, err)
			}
		}},
		{"WithServiceNode", func(t *testing.T, p string) {
			ops := []any{&zk.DeleteRequest{Path: p, Version: -1}, &zk.DeleteRequest{Path: path.Dir(p), Version: -1}}
			if err := multi(raw, ops...); err != nil {
				t.Fatalf("deleting %s and its parent: %v", p, err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := shared(t)
			in := inst(serviceFor(t), "20001")
			in.Metadata = map[string]string{"zone": "eu-1"}
			if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
				t.Fatal(err)
			}
			p := r.NodePath(in.Service, in.ID)
			for i := range 3 { // the watch is set again each time
				tt.delete(t, p)
				start := time.Now()
				step := fmt.Sprintf("after deletion %d", i+1)
				data, stat := awaitNode(t, raw, p, 2*time.Second, step)
				checkOurs(t, r, in, data, stat, step)
				t.Logf("deletion %d: re-created within %v", i+1, time.Since(start))
			}
		})
	}
}

// TestRemovedNodeStaysGone: Deregister and Close delete the node, and
// nothing re-creates it, also when someone else deleted it just before.
func TestRemovedNodeStaysGone(t *testing.T) {
	srv := zktest.Shared(t)
	raw := rawConn(t, srv.Addr())
	tests := []struct {
		name   string
		remove func(t *testing.T, r *Registry, in registry.Instance)
	}{
		{"Deregister", func(t *testing.T, r *Registry, in registry.Instance) {
			if err := r.Deregister(ctxFor(t, 5*time.Second), in); err != nil {
				t.Fatal(err)
			}
		}},
		{"DeletedThenDeregister", func(t *testing.T, r *Registry, in registry.Instance) {
			if err := raw.Delete(r.NodePath(in.Service, in.ID), -1); err != nil {
				t.Fatal(err)
			}
			if err := r.Deregister(ctxFor(t, 5*time.Second), in); err != nil {
				t.Fatal(err)
			}
		}},
		{"Close", func(t *testing.T, r *Registry, _ registry.Instance) {
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}},
		{"DeletedThenClose", func(t *testing.T, r *Registry, in registry.Instance) {
			if err := raw.Delete(r.NodePath(in.Service, in.ID), -1); err != nil {
				t.Fatal(err)
			}
			if err := r.Close(); err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := shared(t)
			in := inst(serviceFor(t), "20001")
			if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
				t.Fatal(err)
			}
			tt.remove(t, r, in)
			staysGone(t, raw, r.NodePath(in.Service, in.ID), time.Second, tt.name)
		})
	}
}

// TestNoFightOverOneID: when another session takes over our instance ID,
// the node it replaced is not re-created over it.
func TestNoFightOverOneID(t *testing.T) {
	srv := zktest.Shared(t)
	first, second := shared(t), shared(t)
	in := inst(serviceFor(t), "20001")
	if err := first.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	if err := second.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, srv.Addr())
	p := second.NodePath(in.Service, in.ID)
	ok, stat, ch, err := raw.ExistsW(p)
	if err != nil || !ok {
		t.Fatalf("ExistsW %s = %v, %v; want it there", p, ok, err)
	}
	if stat.EphemeralOwner != second.sess.conn.SessionID() {
		t.Fatalf("ephemeralOwner = %#x, want the second session %#x", stat.EphemeralOwner, second.sess.conn.SessionID())
	}
	timer := time.NewTimer(time.Second)
	defer timer.Stop()
	select {
	case ev := <-ch:
		_, stat, _ := raw.Exists(p)
		t.Fatalf("%s changed (%v) after the takeover; owner now %#x (first %#x, second %#x)",
			p, ev.Type, stat.EphemeralOwner, first.sess.conn.SessionID(), second.sess.conn.SessionID())
	case <-timer.C:
	}

	// Once the second owner deregisters, the first, which still holds the
	// instance registered, puts it back.
	if err := second.Deregister(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	data, stat := awaitNode(t, raw, p, 2*time.Second, "after the second owner deregistered")
	checkOurs(t, first, in, data, stat, "after the second owner deregistered")
}

// TestNoTakeBackOnReconnect: after another session took our instance ID
// over, a reconnect of ours on the same session (a network blip, a server
// restart, a leader election) restores nothing: our session never ended,
// and the node is left to its new holder.
func TestNoTakeBackOnReconnect(t *testing.T) {
	srv := zktest.Shared(t)
	px := startProxy(t, srv.Addr())
	first := newRegistry(t, Config{Servers: []string{px.Addr()}, SessionTimeout: 6 * time.Second, RequestTimeout: 2 * time.Second})
	second := shared(t)
	restored := make(chan int64, 16)
	setSessionHook(t, first, func(id int64) {
		select {
		case restored <- id:
		default:
		}
	})
	in := inst(serviceFor(t), "20001")
	in.Metadata = map[string]string{"generation": "1"}
	if err := first.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	newer := in
	newer.Metadata = map[string]string{"generation": "2"}
	if err := second.Register(ctxFor(t, 5*time.Second), newer); err != nil {
		t.Fatal(err)
	}
	raw := rawConn(t, srv.Addr())
	p := second.NodePath(in.Service, in.ID)
	if _, stat, err := raw.Get(p); err != nil || stat.EphemeralOwner != second.sess.conn.SessionID() {
		t.Fatalf("after the takeover: %v; want the second session to own %s", err, p)
	}
	for len(restored) > 0 {
		<-restored
	}

	session := first.sess.conn.SessionID()
	px.Cut()
	time.Sleep(300 * time.Millisecond) // a blip, well within the 6 s session timeout
	px.Restore()
	select {
	case id := <-restored: // the keeper has run its restore on the session
		if id != session {
			t.Fatalf("the first registry got a new session %#x (had %#x); the test needs a reconnect on the same one", id, session)
		}
	case <-ctxFor(t, 8*time.Second).Done():
		t.Fatal("the first registry did not reconnect within 8 s")
	}
	data, stat, err := raw.Get(p)
	if err != nil {
		t.Fatalf("Get %s after the reconnect: %v", p, err)
	}
	if stat.EphemeralOwner != second.sess.conn.SessionID() {
		t.Fatalf("after a reconnect on the same session the first registry took %s back (owner %#x, data %s)", p, stat.EphemeralOwner, data)
	}
}

// TestRecreatesDeletedNodeAfterNewSession: the watches are set again on a
// new session, after the old one expired during a partition.
func TestRecreatesDeletedNodeAfterNewSession(t *testing.T) {
	srv := zktest.Shared(t)
	px := startProxy(t, srv.Addr())
	r := newRegistry(t, Config{Servers: []string{px.Addr()}, SessionTimeout: time.Second, RequestTimeout: 2 * time.Second})
	sessions := make(chan int64, 16)
	setSessionHook(t, r, func(id int64) {
		select {
		case sessions <- id:
		default:
		}
	})
	in := inst(serviceFor(t), "20001")
	if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	old := r.sess.conn.SessionID()
	raw := rawConn(t, srv.Addr())
	p := r.NodePath(in.Service, in.ID)
	ok, _, gone, err := raw.ExistsW(p)
	if err != nil || !ok {
		t.Fatalf("ExistsW %s = %v, %v; want it there", p, ok, err)
	}

	px.Cut()
	select {
	case ev := <-gone:
		if ev.Type != zk.EventNodeDeleted {
			t.Fatalf("while cut off: event %v, want the node deleted with the session", ev.Type)
		}
	case <-ctxFor(t, 5*time.Second).Done():
		t.Fatal("the cut-off session did not expire within 5 s")
	}
	px.Restore()
	ctx := ctxFor(t, 10*time.Second)
	for id := old; id == old; {
		select {
		case id = <-sessions:
		case <-ctx.Done():
			t.Fatal("no new session with the node restored within 10 s")
		}
	}
	data, stat := awaitNode(t, raw, p, 2*time.Second, "restored on the new session")
	checkOurs(t, r, in, data, stat, "restored on the new session")

	if err := raw.Delete(p, -1); err != nil {
		t.Fatal(err)
	}
	data, stat = awaitNode(t, raw, p, 2*time.Second, "deleted on the new session")
	checkOurs(t, r, in, data, stat, "deleted on the new session")
}

// TestRestoresChangedData: data someone else writes into our node while
// our session lives (zkCli's set) is replaced by ours again, every time.
func TestRestoresChangedData(t *testing.T) {
	srv := zktest.Shared(t)
	raw := rawConn(t, srv.Addr())
	r := shared(t)
	in := inst(serviceFor(t), "20011")
	in.Metadata = map[string]string{"zone": "eu-2"}
	if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	p := r.NodePath(in.Service, in.ID)
	for i := range 3 { // the watch is set again each time
		step := fmt.Sprintf("after change %d", i+1)
		garbage := []byte(`{"garbage":true}`)
		if _, err := raw.Set(p, garbage, -1); err != nil {
			t.Fatalf("%s: Set %s: %v", step, p, err)
		}
		// Wait, by watching, until the node holds something else again.
		start := time.Now()
		deadline := time.NewTimer(2 * time.Second)
		for {
			data, st, ch, err := raw.GetW(p)
			if err != nil {
				t.Fatalf("%s: GetW %s: %v", step, p, err)
			}
			if !bytes.Equal(data, garbage) {
				checkOurs(t, r, in, data, st, step)
				break
			}
			select {
			case <-ch:
			case <-deadline.C:
				t.Fatalf("%s: %s still holds %q after 2s", step, p, data)
			}
		}
		deadline.Stop()
		t.Logf("change %d: restored within %v", i+1, time.Since(start))
	}
}

// TestRestoresDataChangedBeforeTheWatch: data changed again between the
// guard's restore and its new watch is restored too (the watch was set on
// the changed node and never fired: the node kept the stranger's data).
func TestRestoresDataChangedBeforeTheWatch(t *testing.T) {
	srv := zktest.Shared(t)
	raw := rawConn(t, srv.Addr())
	r := shared(t)
	in := inst(serviceFor(t), "20012")
	p := r.NodePath(in.Service, in.ID)
	var once sync.Once
	changed := make(chan struct{})
	setArmHook(t, r, func(hp string) {
		if hp == p {
			once.Do(func() {
				if _, err := raw.Set(p, []byte(`{"second":true}`), -1); err != nil {
					t.Errorf("Set before the watch: %v", err)
				}
				close(changed)
			})
		}
	})
	if err := r.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Set(p, []byte(`{"first":true}`), -1); err != nil {
		t.Fatal(err)
	}
	select {
	case <-changed:
	case <-time.After(5 * time.Second):
		t.Fatal("the guard did not restore the node after the first change")
	}
	deadline := time.NewTimer(2 * time.Second)
	defer deadline.Stop()
	for {
		data, st, ch, err := raw.GetW(p)
		if err != nil {
			t.Fatalf("GetW %s: %v", p, err)
		}
		if !bytes.HasPrefix(data, []byte(`{"first"`)) && !bytes.HasPrefix(data, []byte(`{"second"`)) {
			checkOurs(t, r, in, data, st, "changed twice, the second time before the watch")
			return
		}
		select {
		case <-ch:
		case <-deadline.C:
			t.Fatalf("%s still holds %s 2s after it was changed twice", p, data)
		}
	}
}

// hookHandler calls fn (once) when a record with message msg is logged, on
// the logging goroutine, before passing the record on.
type hookHandler struct {
	slog.Handler
	msg  string
	once *sync.Once
	fn   func()
}

func (h hookHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(h.fn)
	}
	return h.Handler.Handle(ctx, r)
}

func (h hookHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return hookHandler{h.Handler.WithAttrs(a), h.msg, h.once, h.fn}
}

func (h hookHandler) WithGroup(g string) slog.Handler {
	return hookHandler{h.Handler.WithGroup(g), h.msg, h.once, h.fn}
}

// TestRecreatesANodeAnotherSessionDropsBeforeTheWatch: when the node of an
// instance we own is held by another session and goes between the guard's
// look at it and its watch (which GetW does not set on a missing node),
// the guard looks again and creates ours. The window is hit every time:
// the other holder deregisters from inside the warning the guard logs
// between the two.
func TestRecreatesANodeAnotherSessionDropsBeforeTheWatch(t *testing.T) {
	srv := zktest.Shared(t)
	second := shared(t)
	var once sync.Once
	in := inst(serviceFor(t), "20031")
	hooked := make(chan struct{})
	first := newRegistry(t, Config{Servers: []string{srv.Addr()}, Logger: slog.New(hookHandler{
		Handler: testLogger(t).Handler(),
		msg:     "instance node is held by another session; not replacing it",
		once:    &once,
		fn: func() {
			// The other holder leaves between the guard's Exists and its watch.
			if err := second.Deregister(ctxFor(t, 5*time.Second), in); err != nil {
				t.Errorf("second.Deregister: %v", err)
			}
			close(hooked)
		},
	})})
	if err := first.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	// second takes the ID over: first's watch fires, its guard finds the
	// node held by second.
	if err := second.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hooked:
	case <-time.After(5 * time.Second):
		t.Fatal("the guard never found the node held by another session")
	}
	raw := rawConn(t, srv.Addr())
	p := first.NodePath(in.Service, in.ID)
	data, stat := awaitNode(t, raw, p, 3*time.Second, "after the other holder left between Exists and the watch")
	checkOurs(t, first, in, data, stat, "after the other holder left between Exists and the watch")
}
