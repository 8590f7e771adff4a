package proxy_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// TestNewClientRejectsBadOptions: a balancer or codec name that cannot
// work fails NewClient with an error naming the option, instead of every
// later call.
func TestNewClientRejectsBadOptions(t *testing.T) {
	tests := []struct {
		name  string
		opts  []proxy.Option
		is    error
		wants []string
	}{
		{"unknown balancer", []proxy.Option{proxy.WithBalancer("nope")},
			registry.ErrInvalid, []string{`WithBalancer("nope")`, `unknown balancer "nope"`}},
		{"unknown balancer of one service", []proxy.Option{proxy.WithBalancer("p2c", "svc.A"), proxy.WithBalancer("nope", "svc.B")},
			registry.ErrInvalid, []string{`WithBalancer("nope")`, `unknown balancer "nope"`}},
		{"unknown codec", []proxy.Option{proxy.WithCodec("nope")},
			codec.ErrUnknown, []string{`WithCodec("nope")`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := proxy.NewClient(static.New(), append([]proxy.Option{proxy.WithLogger(quiet)}, tt.opts...)...)
			if err == nil {
				c.Close()
				t.Fatal("NewClient succeeded; want an error")
			}
			if c != nil {
				t.Errorf("NewClient returned a client with its error %v", err)
			}
			if !errors.Is(err, tt.is) {
				t.Errorf("NewClient error %v does not wrap %v", err, tt.is)
			}
			for _, want := range tt.wants {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("NewClient error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestNewClientAcceptsEveryBalancer: each name balancer.New knows, and
// the empty default, makes a client.
func TestNewClientAcceptsEveryBalancer(t *testing.T) {
	for _, name := range []string{"", balancer.Random, balancer.RoundRobin, balancer.LeastActive, balancer.ConsistentHash, balancer.P2C} {
		c, err := proxy.NewClient(static.New(), proxy.WithLogger(quiet), proxy.WithBalancer(name))
		if err != nil {
			t.Errorf("WithBalancer(%q): %v", name, err)
			continue
		}
		c.Close()
	}
}
