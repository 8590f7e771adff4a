package dabb_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/dabbrpc/dabb"
	"github.com/dabbrpc/dabb/proxy"
)

// TestKeptHandlerContext: a handler's context is cancelled with
// context.Canceled when ServeRPC returns, and dabb.IdempotencyKey(ctx)
// names the request it was made for. A handler that hands its context to
// work that outlives it (an audit log, a write-behind of the dedup record,
// via context.WithoutCancel) must see a done context and its own call's
// key while later calls run (a server that reused the context brought it
// back to life with the later call's key, racing with its decoding).
func TestKeptHandlerContext(t *testing.T) {
	p := newProbe()
	got := make(chan context.Context, 1)
	p.record = func(ctx context.Context) {
		select {
		case got <- ctx: // the first call's only
		default:
		}
	}
	_, addr := startServer(t, p)
	c := newClient(t, addr)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if _, err := call(ctx, c, "key", proxy.IdempotencyKey("first")); err != nil {
		t.Fatal(err)
	}
	kept := <-got
	if kept.Err() == nil {
		t.Fatal("the handler's context is not done after the call")
	}
	// Work that outlives the handler keeps the request's values with
	// context.WithoutCancel (Go's way to detach work from a request).
	detached := context.WithoutCancel(kept)
	// While a later call runs, the kept context must still be done and
	// still name the first call.
	for i := range 20 {
		key := fmt.Sprintf("later-%d", i)
		done := make(chan error, 1)
		go func() {
			_, err := call(ctx, c, "sleep:100ms", proxy.IdempotencyKey(key))
			done <- err
		}()
		select {
		case <-p.started:
		case err := <-done:
			t.Fatalf("call %q ended before its handler started: %v", key, err)
		}
		k, err := dabb.IdempotencyKey(detached), kept.Err()
		if cerr := <-done; cerr != nil {
			t.Fatal(cerr)
		}
		if k != "first" {
			t.Fatalf("while call %q ran, the first call's context answered its key %q (Err %v): "+
				"work deduplicated with it would take the first call for the later one", key, k, err)
		}
		if err == nil {
			t.Fatalf("while call %q ran, the first call's (returned) context was no longer done", key)
		}
	}
}
