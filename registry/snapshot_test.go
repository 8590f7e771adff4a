// Tests of the snapshot file as a Cache uses it.

package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

func TestCacheSnapshot(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	st := static.New(inst("a.A", "1"), inst("b.B", "9"))
	defer st.Close()

	c1 := newCache(t, st, registry.CacheConfig{SnapshotPath: path})
	pushes := subscribe(t, c1, "a.A")
	expectPush(t, pushes, "1")
	lookup(t, c1, "b.B")
	mustRegister(t, st, inst("a.A", "2"))
	expectPush(t, pushes, "1,2")
	eventually(t, "the snapshot to hold a.A's new list", func() bool {
		return strings.Contains(readFile(t, path), `"id": "2"`)
	})
	c1.Close()

	var f struct {
		Version  int                            `json:"version"`
		Services map[string][]registry.Instance `json:"services"`
	}
	if err := json.Unmarshal([]byte(readFile(t, path)), &f); err != nil {
		t.Fatalf("snapshot is not JSON: %v", err)
	}
	if f.Version != 1 || idsOf(f.Services["a.A"]) != "1,2" || idsOf(f.Services["b.B"]) != "9" {
		t.Fatalf("snapshot = %+v, want version 1 with a.A [1,2] and b.B [9]", f)
	}
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Fatalf("directory holds %d files, want only the snapshot (no temporary files left)", len(entries))
	}

	// A new process during an outage starts from the snapshot.
	down := newFault(st)
	down.setDown(true)
	c2 := newCache(t, down, registry.CacheConfig{SnapshotPath: path, InitialTimeout: time.Second})
	start := time.Now()
	if got := idsOf(lookup(t, c2, "a.A")); got != "1,2" {
		t.Fatalf("Instances from the snapshot = [%s], want [1,2]", got)
	}
	if took := time.Since(start); took > 500*time.Millisecond {
		t.Errorf("falling back to the snapshot took %v although the registry failed at once", took)
	}
	if !c2.Stale("a.A") {
		t.Fatal("Stale = false for instances read from the snapshot")
	}
	if _, err := c2.Instances(context.Background(), "c.C"); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Instances of a service missing from the snapshot = %v, want ErrUnavailable", err)
	}

	// The registry comes back: the snapshot's list gives way to it.
	pushes2 := subscribe(t, c2, "a.A")
	expectPush(t, pushes2, "1,2")
	mustDeregister(t, st, inst("a.A", "1"))
	down.setDown(false)
	expectPush(t, pushes2, "2")
	if c2.Stale("a.A") {
		t.Fatal("Stale = true after the registry answered")
	}
}

// TestCacheSnapshotThenEmptyAnswer: instances from the snapshot that the
// registry, once it answers, does not list are kept (ProtectEmpty) as
// suspect and stay stale: the registry never confirmed them. Its first
// non-empty list clears both.
func TestCacheSnapshotThenEmptyAnswer(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	if err := os.WriteFile(path, []byte(`{"version":1,"services":{"a.A":[{"service":"a.A","id":"1","addr":"127.0.0.1:1"}]}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	st := static.New()
	defer st.Close()
	f := newFault(st)
	f.setDown(true)
	c := newCache(t, f, registry.CacheConfig{SnapshotPath: path, InitialTimeout: 50 * time.Millisecond})
	if got := idsOf(lookup(t, c, "a.A")); got != "1" {
		t.Fatalf("Instances from the snapshot = [%s], want [1]", got)
	}
	if !c.Stale("a.A") || c.Suspect("a.A") {
		t.Fatalf("from the snapshot: Stale = %v, Suspect = %v; want true, false", c.Stale("a.A"), c.Suspect("a.A"))
	}
	pushes := subscribe(t, c, "a.A")
	expectPush(t, pushes, "1")

	f.setDown(false) // the registry answers: no instances of a.A
	eventually(t, "Suspect after the registry's empty answer", func() bool { return c.Suspect("a.A") })
	if got := idsOf(lookup(t, c, "a.A")); got != "1" {
		t.Fatalf("Instances after the empty answer = [%s], want the snapshot's [1] kept", got)
	}
	if !c.Stale("a.A") {
		t.Fatal("Stale = false for the snapshot's instances, which the registry has not confirmed")
	}

	mustRegister(t, st, inst("a.A", "2"))
	expectPush(t, pushes, "2")
	if c.Stale("a.A") || c.Suspect("a.A") {
		t.Fatalf("after a list from the registry: Stale = %v, Suspect = %v; want both false", c.Stale("a.A"), c.Suspect("a.A"))
	}
}

// TestSnapshotSharedPath: two caches (or processes) sharing a snapshot
// file keep each other's services: each write takes the services it does
// not follow from the file as it is then.
func TestSnapshotSharedPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	st := static.New(inst("x.X", "1"), inst("y.Y", "1"))
	defer st.Close()
	cfg := registry.CacheConfig{SnapshotPath: path}
	c1, c2 := newCache(t, st, cfg), newCache(t, st, cfg)
	pushY := subscribe(t, c2, "y.Y")
	expectPush(t, pushY, "1")
	eventually(t, "c2 to save y.Y", func() bool { return strings.Contains(readFile(t, path), `"y.Y"`) })
	pushX := subscribe(t, c1, "x.X")
	expectPush(t, pushX, "1")
	eventually(t, "c1 to save x.X", func() bool { return strings.Contains(readFile(t, path), `"x.X"`) })
	mustRegister(t, st, inst("y.Y", "2"))
	expectPush(t, pushY, "1,2")
	eventually(t, "c2 to save y.Y's new list", func() bool { return strings.Contains(readFile(t, path), `"id": "2"`) })
	if got := readFile(t, path); !strings.Contains(got, `"x.X"`) {
		t.Fatalf("c2's write dropped x.X, which c1 saved:\n%s", got)
	}
}

func TestCacheBadSnapshot(t *testing.T) {
	tests := []struct {
		name, content string
	}{
		{"NotJSON", "{not json"},
		{"WrongVersion", `{"version":99,"services":{"a.A":[{"id":"1","addr":"127.0.0.1:1"}]}}`},
		{"InvalidInstances", `{"version":1,"services":{"a.A":[{"id":"","addr":"x"}]}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "registry.json")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			st := static.New()
			defer st.Close()
			f := newFault(st)
			f.setDown(true)
			c := newCache(t, f, registry.CacheConfig{SnapshotPath: path, InitialTimeout: 50 * time.Millisecond})
			_, err := c.Instances(context.Background(), "a.A")
			if !errors.Is(err, registry.ErrUnavailable) {
				t.Fatalf("Instances with a bad snapshot = %v, want ErrUnavailable", err)
			}
		})
	}
}

// TestCacheSnapshotForShortDeadline: a first lookup whose caller has less
// time than InitialTimeout falls back to the snapshot after half of it,
// rather than spending it all waiting for a registry that does not answer
// (a process started during an outage, calling methods with short
// timeouts).
func TestCacheSnapshotForShortDeadline(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c1 := newCache(t, st, registry.CacheConfig{SnapshotPath: path})
	lookup(t, c1, "a.A")
	c1.Close()

	c2 := newCache(t, hangingRegistry{st}, registry.CacheConfig{SnapshotPath: path, InitialTimeout: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	ins, err := c2.Instances(ctx, "a.A")
	if err != nil {
		t.Fatalf("a lookup with 200ms left, the registry hanging and a snapshot at hand = %v", err)
	}
	if idsOf(ins) != "1" || !c2.Stale("a.A") {
		t.Fatalf("Instances = [%s] (stale %v), want the snapshot's [1], stale", idsOf(ins), c2.Stale("a.A"))
	}
}
