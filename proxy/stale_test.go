package proxy_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/wait"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// outageRegistry lists its instances once, then fails every watch as a
// registry that went down does.
type outageRegistry struct {
	registry.Registry
	down chan struct{}
}

func (r *outageRegistry) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	w, err := r.Registry.Watch(ctx, service)
	if err != nil {
		return nil, err
	}
	return &outageWatcher{Watcher: w, down: r.down}, nil
}

type outageWatcher struct {
	registry.Watcher
	down   chan struct{}
	listed bool
}

func (w *outageWatcher) Next(ctx context.Context) ([]registry.Instance, error) {
	if !w.listed {
		w.listed = true
		return w.Watcher.Next(ctx)
	}
	select {
	case <-w.down:
		return nil, errors.New("connection refused")
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestClientSaysStale: a client whose registry went down keeps its
// instances and says they are stale.
func TestClientSaysStale(t *testing.T) {
	addr := deadAddr(t)
	reg := &outageRegistry{Registry: static.New(registry.Instance{Service: service, ID: addr, Addr: addr}), down: make(chan struct{})}
	c := newClient(t, reg, proxy.WithLogger(quiet))
	t.Cleanup(func() { c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	if ins, err := c.Instances(ctx, service); err != nil || len(ins) != 1 {
		t.Fatalf("Instances = %v, %v; want the one instance", ins, err)
	}
	if c.Stale(service) || c.Suspect(service) {
		t.Fatalf("fresh instances: Stale %v, Suspect %v; want neither", c.Stale(service), c.Suspect(service))
	}
	close(reg.down)
	wait.Until(t, testTimeout, time.Millisecond, "the client to say its instances are stale", func() bool {
		return c.Stale(service)
	})
	if ins, err := c.Instances(ctx, service); err != nil || len(ins) != 1 {
		t.Errorf("Instances with the registry down = %v, %v; want the one instance kept", ins, err)
	}
	if c.Stale("other.Service") {
		t.Error("a service never looked up is stale")
	}
}
