package registry_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// downThenRefusingRegistry fails Watch as unreachable until refuse is
// set, then refuses the service (ErrInvalid).
type downThenRefusingRegistry struct {
	registry.Registry
	refuse  atomic.Bool
	refused atomic.Int32 // Watch calls answered with the refusal
}

func (r *downThenRefusingRegistry) Watch(context.Context, string) (registry.Watcher, error) {
	if r.refuse.Load() {
		r.refused.Add(1)
		return nil, fmt.Errorf("review: refused: %w", registry.ErrInvalid)
	}
	return nil, fmt.Errorf("review: down: %w", registry.ErrUnavailable)
}

// TestRefusalAfterGivingUp: a service whose first lookup gave up (registry
// unreachable, no snapshot) and that the registry then refuses fails its
// lookups with the refusal (ErrInvalid, for good), not with the outage.
func TestRefusalAfterGivingUp(t *testing.T) {
	st := static.New()
	defer st.Close()
	r := &downThenRefusingRegistry{Registry: st}
	c := newCache(t, r, registry.CacheConfig{InitialTimeout: 50 * time.Millisecond,
		MinRetryDelay: time.Millisecond, MaxRetryDelay: 5 * time.Millisecond})
	if _, err := c.Instances(context.Background(), "a.A"); !errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("first lookup with the registry down = %v, want ErrUnavailable", err)
	}
	r.refuse.Store(true)
	eventually(t, "the registry to refuse the service", func() bool { return r.refused.Load() > 0 })
	// The watch goroutine records the refusal (fail) right after Watch
	// returns: give it a moment.
	var err error
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		if _, err = c.Instances(context.Background(), "a.A"); errors.Is(err, registry.ErrInvalid) {
			break
		}
	}
	if !errors.Is(err, registry.ErrInvalid) || errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("lookup after the registry refused the service = %v; want the refusal (ErrInvalid), not the stale ErrUnavailable", err)
	}
}
