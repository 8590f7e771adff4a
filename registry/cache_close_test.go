package registry_test

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// stopRecorder wraps a registry and counts its watchers stopped after the
// cache's Close had returned.
type stopRecorder struct {
	registry.Registry
	closeReturned atomic.Bool
	stopAfter     atomic.Int32
}

func (r *stopRecorder) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	w, err := r.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	return &stopWatcher{Watcher: w, r: r}, nil
}

type stopWatcher struct {
	registry.Watcher
	r *stopRecorder
}

func (w *stopWatcher) Stop() {
	if w.r.closeReturned.Load() {
		w.r.stopAfter.Add(1)
	}
	w.Watcher.Stop()
}

func snapshotIDs(t *testing.T, path, service string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		return "<" + err.Error() + ">"
	}
	var f struct {
		Services map[string][]registry.Instance `json:"services"`
	}
	if err := json.Unmarshal(b, &f); err != nil {
		t.Fatalf("snapshot: %v", err)
	}
	return idsOf(f.Services[service])
}

// TestCacheNoWorkAfterClose: a watch goroutine inside a subscriber's call
// when Close returns, which Close does not wait for, neither writes the
// snapshot file nor uses the registry's watcher once the call returns (the
// caller may have removed the file's directory or closed the registry).
func TestCacheNoWorkAfterClose(t *testing.T) {
	path := filepath.Join(t.TempDir(), "registry.json")
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	rec := &stopRecorder{Registry: st}
	c := registry.NewCache(rec, registry.CacheConfig{SnapshotPath: path, Logger: slog.New(slog.DiscardHandler)})
	lookup(t, c, "a.A")
	eventually(t, "the snapshot to hold [1]", func() bool { return snapshotIDs(t, path, "a.A") == "1" })

	in, release := make(chan struct{}), make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(release)
		}
	}()
	if _, err := c.Subscribe("a.A", func(ins []registry.Instance) {
		if len(ins) == 2 {
			close(in)
			<-release
		}
	}); err != nil {
		t.Fatal(err)
	}
	mustRegister(t, st, inst("a.A", "2"))
	select {
	case <-in:
	case <-time.After(waitTimeout):
		t.Fatal("the subscriber was not called with [1,2] within 2s")
	}
	closeWithin(t, c, "Close did not return within 2s")
	rec.closeReturned.Store(true)
	atClose := snapshotIDs(t, path, "a.A")

	close(release) // the subscriber's call returns
	released = true
	time.Sleep(300 * time.Millisecond) // a bound on what must not happen

	if after := snapshotIDs(t, path, "a.A"); after != atClose {
		t.Errorf("the snapshot file held [%s] for a.A when Close returned and [%s] afterwards: the cache wrote it after Close had returned", atClose, after)
	}
	if n := rec.stopAfter.Load(); n != 0 {
		t.Errorf("the cache called its watcher's Stop %d time(s) after Close had returned (the caller may have closed the registry by then)", n)
	}
}

// closeWithin closes c from another goroutine and fails the test with
// msg unless Close returns within waitTimeout.
func closeWithin(t *testing.T, c *registry.Cache, msg string) {
	t.Helper()
	closed := make(chan struct{})
	go func() {
		c.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(waitTimeout):
		t.Fatal(msg)
	}
}
