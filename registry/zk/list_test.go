// Tests of Services: the services ZooKeeper holds.

package zk

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
)

// TestServices: the services with instances are listed, sorted, once each;
// a service whose instances all left is not; a prefix never written lists
// none; a closed registry fails.
func TestServices(t *testing.T) {
	srv := zktest.Shared(t)
	prefix := fmt.Sprintf("/listtest-%d", time.Now().UnixNano())
	r := newRegistry(t, Config{Servers: []string{srv.Addr()}, Prefix: prefix})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	got, err := r.Services(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("Services of an empty prefix = %v, %v; want none", got, err)
	}
	ins := []registry.Instance{
		{Service: "svc.B", ID: "b1", Addr: "127.0.0.1:1"},
		{Service: "svc.A", ID: "a1", Addr: "127.0.0.1:2"},
		{Service: "svc.A", ID: "a2", Addr: "127.0.0.1:3"},
		{Service: "svc.Gone", ID: "g1", Addr: "127.0.0.1:4"},
	}
	for _, in := range ins {
		if err := r.Register(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.Deregister(ctx, ins[3]); err != nil {
		t.Fatal(err)
	}
	// The service node of svc.Gone stays, empty.
	if ok, _, err := rawConn(t, srv.Addr()).Exists(prefix + "/svc.Gone"); err != nil || !ok {
		t.Fatalf("the node of svc.Gone: exists %v, %v; want it kept", ok, err)
	}
	got, err = r.Services(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"svc.A", "svc.B"}; !slices.Equal(got, want) {
		t.Fatalf("Services = %v, want %v", got, want)
	}

	r.Close()
	if _, err := r.Services(ctx); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Services after Close: %v, want ErrClosed", err)
	}
}

// TestServicesUnreachable: with no ZooKeeper to answer, Services fails
// within its context's deadline, wrapping ErrNoSession.
func TestServicesUnreachable(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}})
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := r.Services(ctx)
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Services with no server: %v, want registry.ErrUnavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Services took %v past a 300ms deadline", d)
	}
}
