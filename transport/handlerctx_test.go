package transport

import (
	"context"
	"errors"
	"testing"
	"time"
)

func newHandlerCtx(t *testing.T, d time.Duration) (*handlerCtx, context.CancelFunc) {
	t.Helper()
	base, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	c := &handlerCtx{base: base, deadline: time.Now().Add(d)}
	t.Cleanup(func() { c.cancel(context.Canceled) })
	return c, cancel
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

func TestHandlerCtx(t *testing.T) {
	t.Run("deadline via Done", func(t *testing.T) {
		c, _ := newHandlerCtx(t, 20*time.Millisecond)
		if d, ok := c.Deadline(); !ok || d != c.deadline {
			t.Errorf("Deadline() = %v, %v", d, ok)
		}
		done := c.Done()
		if isClosed(done) || c.Err() != nil {
			t.Fatalf("done before the deadline: Err = %v", c.Err())
		}
		waitFor(t, done, "the deadline")
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Errorf("Err = %v, want DeadlineExceeded", c.Err())
		}
		if !errors.Is(context.Cause(c), context.DeadlineExceeded) {
			t.Errorf("Cause = %v, want DeadlineExceeded", context.Cause(c))
		}
	})
	t.Run("deadline via Err only", func(t *testing.T) {
		c, _ := newHandlerCtx(t, -time.Millisecond)
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err past the deadline = %v", c.Err())
		}
		if !isClosed(c.Done()) {
			t.Errorf("Done not closed although Err reported the deadline")
		}
	})
	t.Run("server close", func(t *testing.T) {
		c, closeBase := newHandlerCtx(t, time.Hour)
		done := c.Done()
		closeBase()
		waitFor(t, done, "cancellation by the base context")
		if !errors.Is(c.Err(), context.Canceled) {
			t.Errorf("Err = %v, want Canceled", c.Err())
		}
	})
	t.Run("base already closed", func(t *testing.T) {
		c, closeBase := newHandlerCtx(t, time.Hour)
		closeBase()
		if !errors.Is(c.Err(), context.Canceled) || !isClosed(c.Done()) {
			t.Errorf("Err = %v, Done closed = %v; want Canceled and closed", c.Err(), isClosed(c.Done()))
		}
	})
	t.Run("handler returned", func(t *testing.T) {
		c, _ := newHandlerCtx(t, time.Hour)
		c.cancel(context.Canceled)
		if !errors.Is(c.Err(), context.Canceled) || !isClosed(c.Done()) {
			t.Errorf("after return: Err = %v, Done closed = %v", c.Err(), isClosed(c.Done()))
		}
		c.cancel(context.DeadlineExceeded) // later causes are ignored
		if !errors.Is(c.Err(), context.Canceled) {
			t.Errorf("Err changed to %v", c.Err())
		}
	})
	t.Run("derived contexts", func(t *testing.T) {
		c, _ := newHandlerCtx(t, time.Hour)
		child, cancelChild := context.WithCancel(c)
		defer cancelChild()
		timed, cancelTimed := context.WithTimeout(c, time.Hour)
		defer cancelTimed()
		stopped, cancelStopped := context.WithCancel(c)
		cancelStopped() // unregisters from c before c ends
		if len(c.afters) != 2 {
			t.Errorf("%d after funcs registered, want 2", len(c.afters))
		}
		c.cancel(context.Canceled)
		waitFor(t, child.Done(), "the derived context")
		waitFor(t, timed.Done(), "the derived timeout context")
		if !errors.Is(child.Err(), context.Canceled) || !errors.Is(stopped.Err(), context.Canceled) {
			t.Errorf("child Err = %v, stopped Err = %v", child.Err(), stopped.Err())
		}
	})
	t.Run("AfterFunc", func(t *testing.T) {
		c, _ := newHandlerCtx(t, time.Hour)
		ran := make(chan struct{})
		context.AfterFunc(c, func() { close(ran) })
		never := context.AfterFunc(c, func() { t.Error("a stopped AfterFunc ran") })
		if !never() {
			t.Errorf("stop returned false before the context ended")
		}
		c.cancel(context.Canceled)
		waitFor(t, ran, "the AfterFunc")
		late := make(chan struct{})
		stop := context.AfterFunc(c, func() { close(late) })
		waitFor(t, late, "an AfterFunc registered after the end")
		if stop() {
			t.Errorf("stop returned true after the context ended")
		}
	})
	t.Run("no values", func(t *testing.T) {
		c, _ := newHandlerCtx(t, time.Hour)
		if v := c.Value("k"); v != nil {
			t.Errorf("Value = %v", v)
		}
	})
}
