package transport

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
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

func TestHandlerCtxNoDeadline(t *testing.T) {
	base, closeBase := context.WithCancel(context.Background())
	defer closeBase()
	var c handlerCtx
	c.init(base, time.Time{}, nil)
	defer c.cancel(context.Canceled)
	if d, ok := c.Deadline(); ok || !d.IsZero() {
		t.Errorf("Deadline() = %v, %v; want none", d, ok)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("Err() = %v on a fresh context", err)
	}
	done := c.Done()
	if isClosed(done) {
		t.Fatal("Done closed on a fresh context")
	}
	if c.timer != nil {
		t.Error("a context without deadline armed a timer")
	}
	c.cancel(context.Canceled) // what the client's cancel event does
	waitFor(t, done, "the cancel")
	if !errors.Is(c.Err(), context.Canceled) {
		t.Errorf("Err() = %v, want Canceled", c.Err())
	}
	if s := c.String(); s != "transport.handlerCtx" {
		t.Errorf("String() = %q", s)
	}
}

func TestServerCallReusesUnarmedCtx(t *testing.T) {
	base, closeBase := context.WithCancel(context.Background())
	defer closeBase()
	tests := []struct {
		name  string
		use   func(ctx context.Context)
		reuse bool
	}{
		{"unused", func(context.Context) {}, true},
		{"Err and Deadline", func(ctx context.Context) { _ = ctx.Err(); _, _ = ctx.Deadline() }, true},
		{"Done", func(ctx context.Context) { _ = ctx.Done() }, false},
		{"derived context", func(ctx context.Context) {
			_, cancel := context.WithCancel(ctx)
			defer cancel()
		}, false},
		{"AfterFunc", func(ctx context.Context) { context.AfterFunc(ctx, func() {}) }, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, deadline := range []time.Time{{}, time.Now().Add(time.Hour)} {
				call := &serverCall{ctx: new(handlerCtx)}
				ctx := call.ctx
				ctx.init(base, deadline, nil)
				tt.use(ctx)
				ctx.cancel(context.Canceled) // ServeRPC returned
				call.reuseCtx()
				if got := call.ctx == ctx; got != tt.reuse {
					t.Errorf("deadline %v: context kept for reuse: %v, want %v", !deadline.IsZero(), got, tt.reuse)
				}
				if tt.reuse {
					ctx.init(base, time.Time{}, nil)
					if ctx.Err() != nil || ctx.finished || ctx.armed {
						t.Errorf("init left state behind: err %v, finished %v, armed %v", ctx.Err(), ctx.finished, ctx.armed)
					}
				}
			}
		})
	}
}

// A handler's context, and contexts derived from it, answer Request with
// the request being served; other contexts with nil.
func TestRequestFromContext(t *testing.T) {
	type seen struct {
		direct, derived *protocol.Message
		key, service    string
	}
	got := make(chan seen, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		type userKey struct{}
		derived := context.WithValue(ctx, userKey{}, 1)
		r := Request(ctx)
		s := seen{direct: r, derived: Request(derived)}
		if r == req {
			s.key, s.service = r.IdempotencyKey, r.Service
		}
		got <- s
	}), ServerConfig{})
	p := newPool(t, Config{})
	req := newRequest("x")
	req.IdempotencyKey = "k-7"
	resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
	if err != nil {
		t.Fatalf("RoundTrip: %v", err)
	}
	p.Release(resp)
	s := waitFor(t, got, "the handler")
	if s.direct == nil || s.derived != s.direct {
		t.Fatalf("Request(ctx) = %p, Request(derived) = %p; want the same non-nil request", s.direct, s.derived)
	}
	if s.key != "k-7" || s.service != "test.Echo" {
		t.Errorf("Request(ctx) is not the request served: key %q, service %q", s.key, s.service)
	}
	if r := Request(context.Background()); r != nil {
		t.Errorf("Request(context.Background()) = %v, want nil", r)
	}
}
