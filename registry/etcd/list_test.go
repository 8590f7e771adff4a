// Tests of Services: the services etcd holds.

package etcd

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/registry"
)

// TestServices: the services with instances are listed, sorted, once each;
// keys of another shape are skipped; a prefix never written lists none; a
// closed registry fails.
func TestServices(t *testing.T) {
	srv := etcdtest.Shared(t)
	prefix := fmt.Sprintf("/listtest-%d", time.Now().UnixNano())
	r := newRegistry(t, srv, Config{Prefix: prefix})
	ctx := ctxFor(t, 10*time.Second)

	got, err := r.Services(ctx)
	if err != nil || len(got) != 0 {
		t.Fatalf("Services of an empty prefix = %v, %v; want none", got, err)
	}
	for _, in := range []registry.Instance{
		{Service: "svc.B", ID: "b1", Addr: "127.0.0.1:1"},
		{Service: "svc.A", ID: "a1", Addr: "127.0.0.1:2"},
		{Service: "svc.A", ID: "a2", Addr: "127.0.0.1:3"},
	} {
		if err := r.Register(ctx, in); err != nil {
			t.Fatal(err)
		}
	}
	cli := newClient(t, srv)
	for _, k := range []string{prefix + "/loose", prefix + "/svc.C/deep/er"} {
		if _, err := cli.Put(ctx, k, "{}"); err != nil {
			t.Fatal(err)
		}
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

// TestServicesUnreachable: with no etcd to answer, Services fails within
// its context's deadline, wrapping registry.ErrUnavailable.
func TestServicesUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r, err := New(Config{Endpoints: []string{addr}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = r.Services(ctx)
	if !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Services with no server: %v, want registry.ErrUnavailable", err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("Services took %v past a 300ms deadline", d)
	}
}
