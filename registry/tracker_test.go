package registry_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
	"go.uber.org/goleak"
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
	leaks := goleak.IgnoreCurrent()
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
	// goleak waits for the cache's goroutines to end; once they have,
	// nothing more can be written or stopped.
	goleak.VerifyNone(t, leaks)

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

// TestCacheCloseFromCallback: a subscriber may close the cache, from its
// first call (made by Subscribe on the caller's goroutine) or from a later
// one (made by the service's watch goroutine). Close returns, no call
// follows, and every goroutine of the cache ends.
func TestCacheCloseFromCallback(t *testing.T) {
	tests := []struct {
		name   string
		onCall int32 // the call that closes the cache
	}{
		{"FirstCall", 1},
		{"LaterCall", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := goleak.IgnoreCurrent()
			st := static.New(inst("a.A", "1"))
			defer st.Close()
			c := registry.NewCache(st, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler)})
			lookup(t, c, "a.A")
			var calls atomic.Int32
			closed := make(chan error, 1)
			_, err := c.Subscribe("a.A", func([]registry.Instance) {
				if calls.Add(1) == tt.onCall {
					closed <- c.Close()
				}
			})
			if err != nil {
				t.Fatal(err)
			}
			mustRegister(t, st, inst("a.A", "2"))
			select {
			case err := <-closed:
				if err != nil {
					t.Fatalf("Close from call %d of the subscriber: %v", tt.onCall, err)
				}
			case <-time.After(waitTimeout):
				t.Fatalf("Close from call %d of the subscriber did not return within %v", tt.onCall, waitTimeout)
			}
			if _, err := c.Instances(context.Background(), "a.A"); !errors.Is(err, registry.ErrClosed) {
				t.Fatalf("Instances after Close = %v, want ErrClosed", err)
			}
			mustRegister(t, st, inst("a.A", "3"))
			// goleak waits for the cache's goroutines to end; once they
			// have, no call can come any more.
			goleak.VerifyNone(t, before)
			if n := calls.Load(); n != tt.onCall {
				t.Fatalf("subscriber called %d times, want %d (none after Close)", n, tt.onCall)
			}
		})
	}
}

// TestCacheCloseDoesNotWaitForSubscribers: Close does not wait for a
// subscriber's call in progress (which may itself be calling Close), and
// no subscriber is called once Close has returned.
func TestCacheCloseDoesNotWaitForSubscribers(t *testing.T) {
	leaks := goleak.IgnoreCurrent()
	st := static.New(inst("b.B", "1"))
	defer st.Close()
	c := newCache(t, st, registry.CacheConfig{})
	lookup(t, c, "b.B")
	inB, releaseB := make(chan struct{}), make(chan struct{})
	var calls atomic.Int64
	_, err := c.Subscribe("b.B", func(ins []registry.Instance) {
		calls.Add(1)
		if len(ins) == 2 {
			close(inB)
			<-releaseB
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	defer func() {
		if !released {
			close(releaseB)
		}
	}()
	mustRegister(t, st, inst("b.B", "2"))
	select {
	case <-inB:
	case <-time.After(waitTimeout):
		t.Fatal("b.B's subscriber was not called within 2s")
	}
	closeWithin(t, c, "Close waited for a subscriber's call in progress")
	before := calls.Load()
	mustRegister(t, st, inst("b.B", "3"))
	close(releaseB) // the call in progress returns to the watch goroutine
	released = true
	// goleak waits for the cache's goroutines to end; once they have,
	// no call can come any more.
	goleak.VerifyNone(t, leaks)
	if n := calls.Load(); n != before {
		t.Errorf("a subscriber was called %d more time(s) after Close returned", n-before)
	}
}

// TestCacheCloseFromFirstCallWhileWatchDelivers: Close called by the
// first call of a subscriber (on Subscribe's goroutine) returns although
// the watch goroutine is waiting to call the same subscriber with a newer
// list: that call is dropped.
func TestCacheCloseFromFirstCallWhileWatchDelivers(t *testing.T) {
	before := goleak.IgnoreCurrent()
	st := static.New(inst("a.A", "1"))
	defer st.Close()
	c := registry.NewCache(st, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler)})
	// A subscriber from before the first list: once it has that list,
	// the watch goroutine is done with it and with its subscribers.
	first := make(chan struct{}, 10)
	if _, err := c.Subscribe("a.A", func([]registry.Instance) { first <- struct{}{} }); err != nil {
		t.Fatal(err)
	}
	select {
	case <-first:
	case <-time.After(waitTimeout):
		t.Fatal("no first list within 2s")
	}
	var calls atomic.Int32
	closed := make(chan error, 1)
	go func() {
		_, err := c.Subscribe("a.A", func([]registry.Instance) {
			if calls.Add(1) > 1 {
				return
			}
			// The watch goroutine takes the new list, then waits to
			// deliver it to this subscriber, busy here.
			if err := st.Register(context.Background(), inst("a.A", "2")); err != nil {
				closed <- err
				return
			}
			deadline := time.Now().Add(waitTimeout)
			for ins, _ := c.Instances(context.Background(), "a.A"); idsOf(ins) != "1,2"; ins, _ = c.Instances(context.Background(), "a.A") {
				if time.Now().After(deadline) {
					closed <- fmt.Errorf("the cache holds [%s] after %v, want [1,2]", idsOf(ins), waitTimeout)
					return
				}
				time.Sleep(time.Millisecond)
			}
			closed <- c.Close()
		})
		if err != nil {
			closed <- err
		}
	}()
	select {
	case err := <-closed:
		if err != nil {
			t.Fatalf("Close from the first call: %v", err)
		}
	case <-time.After(2 * waitTimeout):
		t.Fatalf("Close from the first call did not return within %v", 2*waitTimeout)
	}
	goleak.VerifyNone(t, before)
	if n := calls.Load(); n != 1 {
		t.Fatalf("subscriber called %d times, want once (the newer list is dropped at Close)", n)
	}
}
