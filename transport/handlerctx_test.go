// Tests of handlerCtx, Request and RequestMetadata, and of handlerCtx's allocations.

package transport

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

func newTestCtx(t *testing.T, d time.Duration) (*handlerCtx, context.CancelFunc) {
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
		c, _ := newTestCtx(t, 20*time.Millisecond)
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
		c, _ := newTestCtx(t, -time.Millisecond)
		if !errors.Is(c.Err(), context.DeadlineExceeded) {
			t.Fatalf("Err past the deadline = %v", c.Err())
		}
		if !isClosed(c.Done()) {
			t.Errorf("Done not closed although Err reported the deadline")
		}
	})
	t.Run("server close", func(t *testing.T) {
		c, closeBase := newTestCtx(t, time.Hour)
		done := c.Done()
		closeBase()
		waitFor(t, done, "cancellation by the base context")
		if !errors.Is(c.Err(), context.Canceled) {
			t.Errorf("Err = %v, want Canceled", c.Err())
		}
	})
	t.Run("base already closed", func(t *testing.T) {
		c, closeBase := newTestCtx(t, time.Hour)
		closeBase()
		if !errors.Is(c.Err(), context.Canceled) || !isClosed(c.Done()) {
			t.Errorf("Err = %v, Done closed = %v; want Canceled and closed", c.Err(), isClosed(c.Done()))
		}
	})
	t.Run("handler returned", func(t *testing.T) {
		c, _ := newTestCtx(t, time.Hour)
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
		c, _ := newTestCtx(t, time.Hour)
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
		c, _ := newTestCtx(t, time.Hour)
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
		c, _ := newTestCtx(t, time.Hour)
		if v := c.Value("k"); v != nil {
			t.Errorf("Value = %v", v)
		}
	})
}

func TestHandlerCtxNoDeadline(t *testing.T) {
	base, closeBase := context.WithCancel(context.Background())
	defer closeBase()
	c := newHandlerCtx(base, time.Time{}, &protocol.Message{}, nil)
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

// TestKeptHandlerCtx: a handler's context kept past the call (for work
// that goes on after the answer) stays cancelled and keeps answering for
// its own request, whatever the server serves next; Request answers nil
// once the handler returned, since the message is reused.
func TestKeptHandlerCtx(t *testing.T) {
	type keptCtx struct{ ctx, detached context.Context }
	kept := make(chan keptCtx, 1)
	ts := startServer(t, HandlerFunc(func(ctx context.Context, req, resp *protocol.Message) {
		_ = ctx.Err() // read, never armed: the kind a server could be tempted to reuse
		kept <- keptCtx{ctx, context.WithoutCancel(ctx)}
	}), ServerConfig{})
	p := newPool(t, Config{ConnsPerAddr: 1})
	call := func(key, trace string) {
		req := newRequest("x")
		req.IdempotencyKey = key
		req.Attachments = map[string]string{"trace": trace}
		resp, err := p.RoundTrip(testCtx(t), ts.addr, req)
		if err != nil {
			t.Fatalf("RoundTrip: %v", err)
		}
		p.Release(resp)
	}
	call("first", "t-1")
	first := waitFor(t, kept, "the first handler")
	for i := range 3 {
		call(fmt.Sprintf("later-%d", i), fmt.Sprintf("t-later-%d", i))
		waitFor(t, kept, "a later handler")
	}
	if err := first.ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Errorf("Err of a handler context kept past its call = %v; want context.Canceled", err)
	}
	attach, key, ok := RequestMetadata(first.detached)
	if !ok || key != "first" || attach["trace"] != "t-1" {
		t.Errorf("RequestMetadata of a kept context = %v, %q, %v; want its own request's trace t-1 and key first", attach, key, ok)
	}
	if r := Request(first.detached); r != nil {
		t.Errorf("Request of a context kept past its call = %p (service %q); want nil", r, r.Service)
	}
	if _, _, ok := RequestMetadata(context.Background()); ok {
		t.Error("RequestMetadata(context.Background()) reports a request")
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

// plainValue is what the plain form of a handler's context would carry as
// its value, for Request and RequestMetadata.
type plainValue struct {
	req            atomic.Pointer[protocol.Message]
	attachments    map[string]string
	idempotencyKey string
}

// TestHandlerCtxAllocs guards the reason handlerCtx exists: it costs one
// allocation per call, where the plain form costs several. Like net/rpc's
// TestCountMallocs, it fails once that gain is gone.
func TestHandlerCtxAllocs(t *testing.T) {
	base, closeBase := context.WithCancel(context.Background())
	defer closeBase()
	req := &protocol.Message{IdempotencyKey: "k"}
	peer := &Peer{}
	budgets := []struct {
		name   string
		budget time.Duration // zero: none
	}{{"no budget", 0}, {"budget", time.Hour}}

	// perCall is what a handler context costs the server per call: made
	// in dispatch, read by the handler, cancelled in finish.
	perCall := make(map[time.Duration]float64)
	for _, b := range budgets {
		t.Run("handlerCtx vs plain, "+b.name, func(t *testing.T) {
			got := testing.AllocsPerRun(1000, func() {
				var deadline time.Time
				if b.budget > 0 {
					deadline = time.Now().Add(b.budget)
				}
				c := newHandlerCtx(base, deadline, req, peer)
				_ = c.Err()
				c.cancel(context.Canceled)
				c.req.Store(nil)
			})
			plain := testing.AllocsPerRun(1000, func() {
				var ctx context.Context
				var cancel context.CancelFunc
				if b.budget > 0 {
					ctx, cancel = context.WithDeadline(base, time.Now().Add(b.budget))
				} else {
					ctx, cancel = context.WithCancel(base)
				}
				// What Request and RequestMetadata would read from the value.
				v := &plainValue{attachments: req.Attachments, idempotencyKey: req.IdempotencyKey}
				v.req.Store(req)
				ctx = context.WithValue(ctx, handlerCtxKey{}, v)
				_ = ctx.Err()
				cancel()
				v.req.Store(nil)
			})
			t.Logf("allocations per call: handlerCtx %v, plain form %v", got, plain)
			if got >= plain {
				t.Errorf("handlerCtx allocates %v per call, the plain form (context.WithDeadline and context.WithValue) %v: "+
					"its gain is gone. Replace handlerCtx with the plain form, and delete this test.", got, plain)
			}
			perCall[b.budget] = got
		})
	}

	// A two-way call through a real Server, from a raw client that
	// allocates nothing itself: the handler context is all the server
	// allocates.
	ts := startServer(t, echo, ServerConfig{})
	c := dialRaw(t, ts.addr)
	rd := protocol.NewReader(bufioReader(c), protocol.DefaultMaxBody)
	for _, b := range budgets {
		t.Run("served call, "+b.name, func(t *testing.T) {
			req := &protocol.Message{Service: "test.Echo", Method: "Echo", Payload: make([]byte, 64), Timeout: b.budget}
			req.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22))
			call, _ := rawRoundTrip(t, c, rd, req)
			for range 100 { // warm the pools and the workers
				call()
			}
			got := testing.AllocsPerRun(1000, call)
			if want, ok := perCall[b.budget]; ok && got > want {
				t.Errorf("serving one two-way call allocates %v, want at most %v, the handler context's own. "+
					"Something on the call path now allocates, or arms handlerCtx (Done, AfterFunc) on every call "+
					"and spends its gain: find it. If handlerCtx no longer saves anything, replace it with "+
					"context.WithDeadline and context.WithValue.", got, want)
			}
		})
	}
}

// rawRoundTrip returns a func that sends req on c under a new id and reads
// rd until its response, skipping events, and the response it fills.
func rawRoundTrip(t *testing.T, c net.Conn, rd *protocol.Reader, req *protocol.Message) (func(), *protocol.Message) {
	var frame []byte
	resp := new(protocol.Message)
	return func() {
		req.Header.SetID(req.Header.ID() + 1)
		frame = protocol.AppendMessage(frame[:0], req)
		_ = c.SetDeadline(time.Now().Add(defaultTestTimeout))
		if _, err := c.Write(frame); err != nil {
			t.Fatalf("write: %v", err)
		}
		for {
			if err := rd.Read(resp); err != nil {
				t.Fatalf("read: %v", err)
			}
			if !resp.Header.Flags().IsEvent() {
				return
			}
		}
	}, resp
}
