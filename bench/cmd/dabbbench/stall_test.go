package main

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/bench/frameworks"
	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

func TestStallWatch(t *testing.T) {
	const limit = 100 * time.Millisecond
	for _, tc := range []struct {
		name     string
		calls    time.Duration // a call completes this often for callsFor; 0 for none
		callsFor time.Duration // how long calls complete
		sleep    time.Duration
		stalled  bool
	}{
		{"calls keep completing", 5 * time.Millisecond, time.Second, 300 * time.Millisecond, false},
		{"no call completes", 0, 0, 2 * time.Second, true},
		{"calls stop midway", 5 * time.Millisecond, 100 * time.Millisecond, 2 * time.Second, true},
		{"shorter than the limit", 0, 0, limit / 2, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var calls atomic.Uint64
			w := newStallWatch(limit, calls.Load)
			stop := make(chan struct{})
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				if tc.calls == 0 {
					return
				}
				tick := time.NewTicker(tc.calls)
				defer tick.Stop()
				end := time.After(tc.callsFor)
				for {
					select {
					case <-tick.C:
						calls.Add(1)
					case <-end:
						return
					case <-stop:
						return
					}
				}
			}()
			t0 := time.Now()
			err := w.sleep(tc.sleep, "in the test")
			elapsed := time.Since(t0)
			close(stop)
			<-ended
			if !tc.stalled {
				if err != nil || elapsed < tc.sleep {
					t.Fatalf("sleep(%v) = %v after %v, want nil after the whole sleep", tc.sleep, err, elapsed)
				}
				return
			}
			if !errors.Is(err, errStalled) || !strings.Contains(err.Error(), "for 100ms in the test") {
				t.Fatalf("sleep = %v, want errStalled naming the limit and the phase", err)
			}
			if elapsed >= tc.sleep {
				t.Errorf("the stall was reported after %v, the whole sleep", elapsed)
			}
		})
	}
}

// standIn is a client that answers at once, except that its first fail
// calls fail and its call number stick (from 1; every call from it on, if
// stickAll) blocks until release is closed.
type standIn struct {
	n        atomic.Int64
	fail     int64
	stick    int64
	stickAll bool
	release  chan struct{}
}

func (s *standIn) Echo(_ context.Context, req *benchpb.BenchmarkMessage) (*benchpb.BenchmarkMessage, error) {
	k := s.n.Add(1)
	switch {
	case k <= s.fail:
		return nil, errors.New("stand-in failure")
	case k == s.stick || s.stickAll && k >= s.stick && s.stick > 0:
		<-s.release
		return nil, errors.New("stand-in released")
	}
	time.Sleep(100 * time.Microsecond)
	reply := new(benchpb.BenchmarkMessage)
	benchpb.CopyTo(reply, req)
	benchpb.Answer(reply)
	return reply, nil
}

func (*standIn) Close() error { return nil }

// TestMeasureStalls runs measure with a server process for the samples
// and a stand-in client: a window whose calls never return, or whose one
// lost reply would hold the wait for the callers, fails with errStalled
// instead of hanging; failed warm-up calls are counted.
func TestMeasureStalls(t *testing.T) {
	ch, err := startChild(frameworks.Raw(), "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	defer ch.stop()
	defer func(l time.Duration) { stallLimit = l }(stallLimit)
	stallLimit = 200 * time.Millisecond
	for _, tc := range []struct {
		name      string
		client    *standIn
		c         int
		warmup    time.Duration
		wantErr   string // "" for a point
		wantFirst string
	}{
		{"no call returns", &standIn{stick: 1, stickAll: true}, 4, 5 * time.Second, "no call completed for 200ms in the warm-up", ""},
		{"a reply lost", &standIn{stick: 50}, 2, 50 * time.Millisecond, "no call completed for 200ms while the window's last calls finished", ""},
		{"warm-up errors counted", &standIn{fail: 3}, 1, 100 * time.Millisecond, "", "in the warm-up: stand-in failure"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.client.release = make(chan struct{})
			defer close(tc.client.release) // the stuck callers end
			t0 := time.Now()
			p, err := measure(tc.client, ch, spec{label: "c", payload: "small", c: tc.c}, tc.warmup, 100*time.Millisecond)
			if elapsed := time.Since(t0); elapsed > 3*time.Second {
				t.Errorf("measure took %v", elapsed)
			}
			if tc.wantErr != "" {
				if !errors.Is(err, errStalled) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("measure = %v, want errStalled with %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if p.Errors != uint64(tc.client.fail) || p.FirstErr != tc.wantFirst || p.Calls == 0 {
				t.Fatalf("%d calls, %d errors, first %q; want calls, %d errors, first %q", p.Calls, p.Errors, p.FirstErr, tc.client.fail, tc.wantFirst)
			}
		})
	}
}
