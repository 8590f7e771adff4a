package zk

import (
	"encoding/json"
	"errors"
	"path"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
)

// RegisterAt keeps nodes of any depth below the prefix on the Registry's
// one session: it creates the parents persistent, re-creates a node
// deleted by someone else, and DeregisterAt and Close remove them.
func TestRegisterAt(t *testing.T) {
	srv := zktest.Shared(t)
	prefix := "/registerat/" + serviceFor(t)
	r := newRegistry(t, Config{Servers: []string{srv.Addr()}, Prefix: prefix})
	raw := rawConn(t, srv.Addr())
	ctx := ctxFor(t, 10*time.Second)

	a, b := prefix+"/com.example.A/providers/node-a", prefix+"/com.example.B/providers/node-b"
	inA, inB := inst("providers", "20001"), inst("providers", "20002")
	if err := r.RegisterAt(ctx, a, inA); err != nil {
		t.Fatal(err)
	}
	if err := r.RegisterAt(ctx, b, inB); err != nil {
		t.Fatal(err)
	}
	owners := map[int64]bool{}
	for p, want := range map[string]registry.Instance{a: inA, b: inB} {
		data, stat, err := raw.Get(p)
		if err != nil {
			t.Fatalf("Get %s: %v", p, err)
		}
		owners[stat.EphemeralOwner] = true
		var got registry.Instance
		if err := json.Unmarshal(data, &got); err != nil || !registry.EqualSets([]registry.Instance{got}, []registry.Instance{want}) {
			t.Errorf("%s holds %q (%v), want %+v", p, data, err, want)
		}
		_, pstat, err := raw.Get(path.Dir(p))
		if err != nil || pstat.EphemeralOwner != 0 {
			t.Errorf("the parent of %s: %v, owner %#x; want a persistent node", p, err, pstat.EphemeralOwner)
		}
	}
	if len(owners) != 1 || owners[0] {
		t.Errorf("the nodes' ephemeral owners are %v; want one session for both", owners)
	}

	if err := raw.Delete(a, -1); err != nil {
		t.Fatal(err)
	}
	data, stat := awaitNode(t, raw, a, 5*time.Second, "after someone else deleted it")
	checkOurs(t, r, inA, data, stat, "re-created")

	if err := r.DeregisterAt(ctx, a); err != nil {
		t.Fatal(err)
	}
	staysGone(t, raw, a, 300*time.Millisecond, "after DeregisterAt")
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := raw.Exists(b); err != nil || ok {
		t.Errorf("after Close: Exists(%s) = %v, %v; want false", b, ok, err)
	}
}

// RegisterAt and DeregisterAt refuse a path that is not clean, not below
// the prefix, or right under it, before any I/O.
func TestRegisterAtRefuses(t *testing.T) {
	r, err := New(Config{Servers: []string{deadAddr(t)}, Prefix: "/p"})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	in := inst("providers", "1")
	for _, p := range []string{"", "p/a/b", "/q/a/b", "/p", "/p/a", "/p/a/../b/c", "/p/a//b", "/p/a/b/", "/pa/b/c"} {
		if err := r.RegisterAt(ctxFor(t, time.Second), p, in); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("RegisterAt(%q) = %v; want ErrInvalid", p, err)
		}
		if err := r.DeregisterAt(ctxFor(t, time.Second), p); !errors.Is(err, registry.ErrInvalid) {
			t.Errorf("DeregisterAt(%q) = %v; want ErrInvalid", p, err)
		}
	}
	if err := r.RegisterAt(ctxFor(t, time.Second), "/p/a/b", registry.Instance{}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("RegisterAt of an invalid instance = %v; want ErrInvalid", err)
	}
}
