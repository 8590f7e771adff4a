package registry_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// reachRegistry is a hangingRegistry whose client knows whether it can
// reach the registry, as the etcd and ZooKeeper backends do.
type reachRegistry struct {
	hangingRegistry
	unreachable error
}

func (r reachRegistry) Unreachable() error { return r.unreachable }

var errNoRoute = errors.New("fake: 127.0.0.1:1 unreachable: connection refused")

// TestCacheSaysRegistryUnreachable: a first lookup that got no answer
// within InitialTimeout, no watch attempt having failed, says that the
// registry could not be reached when its client knows it, wrapping the
// client's error and ErrUnavailable; with a client that is connected, or
// cannot tell, it says the registry did not answer.
func TestCacheSaysRegistryUnreachable(t *testing.T) {
	st := static.New()
	defer st.Close()
	const initial = 100 * time.Millisecond
	tests := []struct {
		name     string
		r        registry.Registry
		want     string
		notWant  string
		wrapping error
	}{
		{"unreachable", reachRegistry{hangingRegistry{st}, fmt.Errorf("%w: %w", registry.ErrUnavailable, errNoRoute)},
			"the registry could not be reached in 100ms: registry: unavailable: " + errNoRoute.Error(), "no answer", errNoRoute},
		{"connected", reachRegistry{hangingRegistry{st}, nil}, "no answer within 100ms", "could not be reached", nil},
		{"cannot tell", hangingRegistry{st}, "no answer within 100ms", "could not be reached", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := newCache(t, tt.r, registry.CacheConfig{InitialTimeout: initial})
			_, err := c.Instances(context.Background(), "a.A")
			if err == nil || !errors.Is(err, registry.ErrUnavailable) {
				t.Fatalf("Instances = %v; want an error wrapping registry.ErrUnavailable", err)
			}
			if !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), tt.notWant) {
				t.Fatalf("Instances = %q; want it to say %q, not %q", err, tt.want, tt.notWant)
			}
			if tt.wrapping != nil && !errors.Is(err, tt.wrapping) {
				t.Fatalf("Instances = %v; want it to wrap the client's error %q", err, tt.wrapping)
			}
			// Later lookups fail at once with the same error.
			ctx, cancel := context.WithTimeout(context.Background(), initial/2)
			defer cancel()
			if _, again := c.Instances(ctx, "a.A"); again == nil || again.Error() != err.Error() {
				t.Fatalf("second lookup = %v; want the first one's error at once: %v", again, err)
			}
		})
	}
}
