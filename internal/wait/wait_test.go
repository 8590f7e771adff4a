package wait

import (
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestUntilReturnsOnceTrue(t *testing.T) {
	var n atomic.Int32
	Until(t, time.Second, time.Millisecond, "three polls", func() bool { return n.Add(1) >= 3 })
	if got := n.Load(); got != 3 {
		t.Fatalf("cond called %d times, want 3", got)
	}
}

// fatalRecorder records Fatalf instead of stopping the test.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = format
}

func TestUntilFailsAfterTimeout(t *testing.T) {
	r := &fatalRecorder{TB: t}
	start := time.Now()
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Fatalf does not stop this goroutine here, so make cond true
		// once it was called, to end the loop.
		failed := false
		Until(r, 20*time.Millisecond, time.Millisecond, "never", func() bool {
			if r.msg != "" {
				failed = true
			}
			return failed
		})
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Until did not give up")
	}
	if r.msg == "" {
		t.Fatal("Until did not fail after its timeout")
	}
	if el := time.Since(start); el < 20*time.Millisecond {
		t.Fatalf("Until failed after %v, before its 20ms timeout", el)
	}
}
