package registry_test

import (
	"context"
	"errors"
	"testing"

	"github.com/dabbrpc/dabb/registry"
)

// WaitNext calls poll again only after the channel poll returned closes,
// and returns the first set or error poll gives.
func TestWaitNextWaitsForChange(t *testing.T) {
	changes := []chan struct{}{make(chan struct{}), make(chan struct{})}
	polls := 0
	want := []registry.Instance{{ID: "a"}}
	poll := func() ([]registry.Instance, <-chan struct{}, error) {
		polls++
		if polls <= len(changes) {
			ch := changes[polls-1]
			close(ch) // the change comes at once; WaitNext must wait on this channel
			return nil, ch, nil
		}
		return want, nil, nil
	}
	got, err := registry.WaitNext(context.Background(), make(chan struct{}), poll)
	if err != nil || len(got) != 1 || got[0].ID != "a" {
		t.Fatalf("WaitNext = %v, %v; want [a], nil", got, err)
	}
	if polls != 3 {
		t.Errorf("poll called %d times, want 3", polls)
	}

	boom := errors.New("boom")
	_, err = registry.WaitNext(context.Background(), make(chan struct{}), func() ([]registry.Instance, <-chan struct{}, error) {
		return nil, nil, boom
	})
	if !errors.Is(err, boom) {
		t.Errorf("WaitNext = %v, want poll's error", err)
	}
}

// A closed stop and an ended ctx end the wait, and poll is not called
// once either is done.
func TestWaitNextStops(t *testing.T) {
	never := make(chan struct{})
	blocked := func() ([]registry.Instance, <-chan struct{}, error) { return nil, never, nil }
	failing := func() ([]registry.Instance, <-chan struct{}, error) {
		t.Error("poll called after the watcher stopped or ctx ended")
		return nil, nil, nil
	}

	stop := make(chan struct{})
	close(stop)
	if _, err := registry.WaitNext(context.Background(), stop, failing); !errors.Is(err, registry.ErrWatcherStopped) {
		t.Errorf("WaitNext after Stop = %v, want ErrWatcherStopped", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := registry.WaitNext(ctx, make(chan struct{}), failing); !errors.Is(err, context.Canceled) {
		t.Errorf("WaitNext with an ended ctx = %v, want context.Canceled", err)
	}

	// While waiting: stop closes, or ctx ends.
	stop = make(chan struct{})
	done := make(chan error, 1)
	go func() {
		_, err := registry.WaitNext(context.Background(), stop, blocked)
		done <- err
	}()
	close(stop)
	if err := <-done; !errors.Is(err, registry.ErrWatcherStopped) {
		t.Errorf("WaitNext stopped while waiting = %v, want ErrWatcherStopped", err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	go func() {
		_, err := registry.WaitNext(ctx, make(chan struct{}), blocked)
		done <- err
	}()
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("WaitNext cancelled while waiting = %v, want context.Canceled", err)
	}
}
