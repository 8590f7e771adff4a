package zk

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
)

// hookHandler calls fn (once) when a record with message msg is logged, on
// the logging goroutine, before passing the record on.
type hookHandler struct {
	slog.Handler
	msg  string
	once *sync.Once
	fn   func()
}

func (h hookHandler) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == h.msg {
		h.once.Do(h.fn)
	}
	return h.Handler.Handle(ctx, r)
}

func (h hookHandler) WithAttrs(a []slog.Attr) slog.Handler {
	return hookHandler{h.Handler.WithAttrs(a), h.msg, h.once, h.fn}
}

func (h hookHandler) WithGroup(g string) slog.Handler {
	return hookHandler{h.Handler.WithGroup(g), h.msg, h.once, h.fn}
}

// TestRecreatesANodeAnotherSessionDropsBeforeTheWatch: when the node of an
// instance we own is held by another session and goes between the guard's
// look at it and its watch (which GetW does not set on a missing node),
// the guard looks again and creates ours. The window is hit every time:
// the other holder deregisters from inside the warning the guard logs
// between the two.
func TestRecreatesANodeAnotherSessionDropsBeforeTheWatch(t *testing.T) {
	srv := zktest.Shared(t)
	second := shared(t)
	var once sync.Once
	in := inst(serviceFor(t), "20031")
	hooked := make(chan struct{})
	first := newRegistry(t, Config{Servers: []string{srv.Addr()}, Logger: slog.New(hookHandler{
		Handler: testLogger(t).Handler(),
		msg:     "instance node is held by another session; not replacing it",
		once:    &once,
		fn: func() {
			// The other holder leaves between the guard's Exists and its watch.
			if err := second.Deregister(ctxFor(t, 5*time.Second), in); err != nil {
				t.Errorf("second.Deregister: %v", err)
			}
			close(hooked)
		},
	})})
	if err := first.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	// second takes the ID over: first's watch fires, its guard finds the
	// node held by second.
	if err := second.Register(ctxFor(t, 5*time.Second), in); err != nil {
		t.Fatal(err)
	}
	select {
	case <-hooked:
	case <-time.After(5 * time.Second):
		t.Fatal("the guard never found the node held by another session")
	}
	raw := rawConn(t, srv.Addr())
	p := first.NodePath(in.Service, in.ID)
	data, stat := awaitNode(t, raw, p, 3*time.Second, "after the other holder left between Exists and the watch")
	checkOurs(t, first, in, data, stat, "after the other holder left between Exists and the watch")
}
