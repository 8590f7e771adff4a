// Tests of the names ZooKeeper accepts.

package zk

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
)

func TestInvalidNamesNeverReachZooKeeper(t *testing.T) {
	// A dead address: a call that got past validation would fail with
	// ErrNoSession instead of registry.ErrInvalid.
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: 200 * time.Millisecond})
	tests := []struct {
		name string
		in   registry.Instance
	}{
		{"C1Control", registry.Instance{Service: "svc\u0085", ID: "a", Addr: "127.0.0.1:1"}},
		{"PrivateUse", registry.Instance{Service: "svc", ID: "a\ue000", Addr: "127.0.0.1:1"}},
		{"InvalidUTF8", registry.Instance{Service: "svc\xff", ID: "a", Addr: "127.0.0.1:1"}},
		{"DotID", registry.Instance{Service: "svc", ID: "..", Addr: "127.0.0.1:1"}},
		{"NoAddr", registry.Instance{Service: "svc", ID: "a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := r.Register(context.Background(), tt.in)
			if !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("Register(%+v) = %v, want registry.ErrInvalid", tt.in, err)
			}
			if tt.in.Addr == "" {
				return // Deregister needs no address
			}
			if err := r.Deregister(context.Background(), tt.in); !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("Deregister(%+v) = %v, want registry.ErrInvalid", tt.in, err)
			}
			if tt.in.Service == "svc" {
				return // a valid service name
			}
			if _, err := r.Watch(context.Background(), tt.in.Service); !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("Watch(%q) = %v, want registry.ErrInvalid", tt.in.Service, err)
			}
		})
	}
}

// TestSupplementaryCharRejected: ZooKeeper checks node names per UTF-16
// unit and refuses the surrogate range, so a character beyond U+FFFF (an
// emoji) is refused here, as ErrInvalid, before any request: Register
// would fail at the server and Watch would wait forever on a name no
// instance can have.
func TestSupplementaryCharRejected(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{zktest.Shared(t).Addr()}})
	svc := serviceFor(t)
	in := registry.Instance{Service: svc, ID: "a\U0001F600", Addr: "127.0.0.1:1"}
	if err := r.Register(ctxFor(t, 5*time.Second), in); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("Register(ID %q) = %v, want registry.ErrInvalid", in.ID, err)
	}
	if w, err := r.Watch(ctxFor(t, 5*time.Second), svc+"\U0001F600"); !errors.Is(err, registry.ErrInvalid) {
		if w != nil {
			w.Stop()
		}
		t.Errorf("Watch(%q) = %v, want registry.ErrInvalid: no instance can ever be registered under it", svc+"\U0001F600", err)
	}
}

// TestCacheRefusedName: a Cache over zk looking up a name that
// registry.ValidateService accepts and ZooKeeper refuses gets an error
// wrapping registry.ErrInvalid at once, not an outage after InitialTimeout.
func TestCacheRefusedName(t *testing.T) {
	r := newRegistry(t, Config{Servers: []string{deadAddr(t)}, RequestTimeout: 200 * time.Millisecond})
	const initialTimeout = 2 * time.Second
	c := registry.NewCache(r, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler), InitialTimeout: initialTimeout})
	defer c.Close()
	svc := "svc\u0085" // a C1 control character
	if err := registry.ValidateService(svc); err != nil {
		t.Fatalf("registry.ValidateService(%q) = %v; the test needs a name only zk refuses", svc, err)
	}
	start := time.Now()
	_, err := c.Instances(ctxFor(t, 3*initialTimeout), svc)
	took := time.Since(start)
	if !errors.Is(err, registry.ErrInvalid) || errors.Is(err, registry.ErrUnavailable) {
		t.Fatalf("Instances(%q) = %v; want an error wrapping registry.ErrInvalid, not registry.ErrUnavailable", svc, err)
	}
	if took >= initialTimeout/2 {
		t.Fatalf("Instances(%q) took %v; want the refusal at once, not after InitialTimeout (%v)", svc, took, initialTimeout)
	}
}
