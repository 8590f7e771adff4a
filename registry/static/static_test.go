package static_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/registrytest"
	"github.com/dabbrpc/dabb/registry/static"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// client is one process's view of a shared static registry: Close
// deregisters what it registered and ends its watches, as a networked
// backend's client does.
type client struct {
	shared *static.Registry

	mu       sync.Mutex // guards following
	closed   bool
	mine     map[[2]string]registry.Instance
	watchers []registry.Watcher
}

func (c *client) Register(ctx context.Context, in registry.Instance) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return registry.ErrClosed
	}
	if err := c.shared.Register(ctx, in); err != nil {
		return err
	}
	c.mine[[2]string{in.Service, in.ID}] = in
	return nil
}

func (c *client) Deregister(ctx context.Context, in registry.Instance) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return registry.ErrClosed
	}
	delete(c.mine, [2]string{in.Service, in.ID})
	return c.shared.Deregister(ctx, in)
}

func (c *client) Watch(ctx context.Context, service string) (registry.Watcher, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, registry.ErrClosed
	}
	w, err := c.shared.Watch(ctx, service)
	if err == nil {
		c.watchers = append(c.watchers, w)
	}
	return w, err
}

func (c *client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return registry.ErrClosed
	}
	c.closed = true
	for _, w := range c.watchers {
		w.Stop()
	}
	for _, in := range c.mine {
		if err := c.shared.Deregister(context.Background(), in); err != nil {
			return err
		}
	}
	return nil
}

func TestConformance(t *testing.T) {
	shared := static.New()
	t.Cleanup(func() { shared.Close() })
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		return &client{shared: shared, mine: make(map[[2]string]registry.Instance)}
	})
}

func TestFixedInstancesServeEveryService(t *testing.T) {
	r := static.New(
		registry.Instance{Addr: "127.0.0.1:20880"},
		registry.Instance{Addr: "127.0.0.1:20881", Weight: 5},
		registry.Instance{Service: "only.One", ID: "x", Addr: "127.0.0.1:1"},
	)
	defer r.Close()
	tests := []struct {
		service string
		want    []registry.Instance
	}{
		{"a.A", []registry.Instance{
			{Service: "a.A", ID: "127.0.0.1:20880", Addr: "127.0.0.1:20880"},
			{Service: "a.A", ID: "127.0.0.1:20881", Addr: "127.0.0.1:20881", Weight: 5},
		}},
		{"only.One", []registry.Instance{
			{Service: "only.One", ID: "127.0.0.1:20880", Addr: "127.0.0.1:20880"},
			{Service: "only.One", ID: "127.0.0.1:20881", Addr: "127.0.0.1:20881", Weight: 5},
			{Service: "only.One", ID: "x", Addr: "127.0.0.1:1"},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.service, func(t *testing.T) {
			got := first(t, r, tt.service)
			if !registry.EqualSets(got, tt.want) {
				t.Fatalf("Watch(%s) = %+v, want %+v", tt.service, got, tt.want)
			}
		})
	}
}

func first(t *testing.T, r registry.Registry, service string) []registry.Instance {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	w, err := r.Watch(ctx, service)
	if err != nil {
		t.Fatalf("Watch(%s): %v", service, err)
	}
	defer w.Stop()
	got, err := w.Next(ctx)
	if err != nil {
		t.Fatalf("Next(%s): %v", service, err)
	}
	return got
}

func TestOpenURL(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	tests := []struct {
		url     string
		want    []string // addresses; nil means an error
		wantErr bool
	}{
		{url: "static://127.0.0.1:20880,127.0.0.1:20881", want: []string{"127.0.0.1:20880", "127.0.0.1:20881"}},
		{url: "static://localhost:1", want: []string{"localhost:1"}},
		{url: "STATIC://127.0.0.1:2", want: []string{"127.0.0.1:2"}},
		{url: "static://", wantErr: true},
		{url: "static://127.0.0.1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			r, err := registry.Open(ctx, tt.url)
			if tt.wantErr {
				if err == nil {
					r.Close()
					t.Fatalf("Open(%q) = nil error, want one", tt.url)
				}
				return
			}
			if err != nil {
				t.Fatalf("Open(%q): %v", tt.url, err)
			}
			defer r.Close()
			got := first(t, r, "svc.S")
			if len(got) != len(tt.want) {
				t.Fatalf("got %+v, want addresses %v", got, tt.want)
			}
			for i, in := range got {
				if in.Addr != tt.want[i] || in.ID != tt.want[i] || in.Service != "svc.S" {
					t.Errorf("instance %d = %+v, want ID and Addr %s of svc.S", i, in, tt.want[i])
				}
			}
		})
	}
}

func TestCloseEndsWatchers(t *testing.T) {
	r := static.New()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	w, err := r.Watch(ctx, "a.A")
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	if _, err := w.Next(ctx); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := w.Next(ctx)
		done <- err
	}()
	if err := r.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Next after Close: %v, want ErrClosed", err)
	}
	if err := r.Register(ctx, registry.Instance{Service: "a.A", ID: "a", Addr: "127.0.0.1:1"}); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Register after Close: %v, want ErrClosed", err)
	}
}

func TestReturnedSetIsACopy(t *testing.T) {
	r := static.New(registry.Instance{Service: "a.A", ID: "a", Addr: "127.0.0.1:1", Metadata: map[string]string{"v": "1"}})
	defer r.Close()
	got := first(t, r, "a.A")
	got[0].Metadata["v"] = "changed"
	if again := first(t, r, "a.A"); again[0].Metadata["v"] != "1" {
		t.Fatalf("changing a returned set changed the registry: metadata %v", again[0].Metadata)
	}
}

// TestOpenIPv6List: a URL's host may list several addresses, IPv6
// literals among them (net/url alone takes the list as one host and
// refuses it).
func TestOpenIPv6List(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	for _, u := range []string{
		"static://[::1]:20880,[::1]:20881",
		"static://127.0.0.1:20880,[::1]:20881",
	} {
		r, err := registry.Open(ctx, u)
		if err != nil {
			t.Errorf("Open(%q): %v", u, err)
			continue
		}
		if got := first(t, r, "svc.S"); len(got) != 2 {
			t.Errorf("Open(%q): %d instances, want 2", u, len(got))
		}
		r.Close()
	}
}

// TestServices: services registered by name are listed, sorted, until
// their last instance leaves; fixed instances name no service.
func TestServices(t *testing.T) {
	ctx := context.Background()
	r := static.New(registry.Instance{Addr: "127.0.0.1:1"}, registry.Instance{Service: "svc.B", Addr: "127.0.0.1:2"})
	defer r.Close()
	a := registry.Instance{Service: "svc.A", ID: "a1", Addr: "127.0.0.1:3"}
	if err := r.Register(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Services(ctx); err != nil || !slices.Equal(got, []string{"svc.A", "svc.B"}) {
		t.Fatalf("Services = %v, %v; want [svc.A svc.B]", got, err)
	}
	if err := r.Deregister(ctx, a); err != nil {
		t.Fatal(err)
	}
	if got, err := r.Services(ctx); err != nil || !slices.Equal(got, []string{"svc.B"}) {
		t.Fatalf("Services after the last instance of svc.A left = %v, %v; want [svc.B]", got, err)
	}
	u, err := registry.Open(ctx, "static://127.0.0.1:4")
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if got, err := u.(registry.Lister).Services(ctx); err != nil || len(got) != 0 {
		t.Fatalf("Services of static://127.0.0.1:4 = %v, %v; want none", got, err)
	}
	r.Close()
	if _, err := r.Services(ctx); !errors.Is(err, registry.ErrClosed) {
		t.Fatalf("Services after Close: %v, want ErrClosed", err)
	}
}
