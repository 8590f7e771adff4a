package registry_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		url     string
		wantErr string // substring; empty: success
		is      error
	}{
		{url: "static://127.0.0.1:20880,127.0.0.1:20881"},
		{url: "zk://127.0.0.1:2181/services", wantErr: `import _ "github.com/dabbrpc/dabb/registry/zk"`, is: registry.ErrUnknownScheme},
		{url: "etcd://127.0.0.1:2379", wantErr: `import _ "github.com/dabbrpc/dabb/registry/etcd"`, is: registry.ErrUnknownScheme},
		{url: "zookeeper://127.0.0.1:2181", wantErr: `import _ "github.com/dabbrpc/dabb/dubbo"`, is: registry.ErrUnknownScheme},
		{url: "consul://127.0.0.1:8500", wantErr: "registered: ", is: registry.ErrUnknownScheme},
		{url: "127.0.0.1:2379", wantErr: "no scheme"},
		{url: "static://", wantErr: "no addresses", is: registry.ErrInvalid},
		{url: "etcd://%zz", wantErr: "invalid URL escape"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			r, err := registry.Open(ctx, tt.url)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("Open: %v", err)
				}
				r.Close()
				return
			}
			if err == nil {
				r.Close()
				t.Fatalf("Open(%q) succeeded, want an error containing %q", tt.url, tt.wantErr)
			}
			if !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %q does not contain %q", err, tt.wantErr)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %q does not wrap %v", err, tt.is)
			}
		})
	}
}

// schemeRuns counts runs of TestRegisterSchemePanics.
var schemeRuns int

func TestRegisterSchemePanics(t *testing.T) {
	open := func(context.Context, *url.URL, registry.OpenConfig) (registry.Registry, error) {
		return static.New(), nil
	}
	tests := []struct {
		name   string
		scheme string
		open   registry.OpenFunc
	}{
		{"Duplicate", "static", open},
		{"Empty", "", open},
		{"NilFunc", "nilfunc", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			defer func() {
				if recover() == nil {
					t.Fatalf("RegisterScheme(%q) did not panic", tt.scheme)
				}
			}()
			registry.RegisterScheme(tt.scheme, tt.open)
		})
	}
	// The scheme table is global and outlives a test: a fresh name per
	// run keeps -count=N working.
	schemeRuns++
	scheme := fmt.Sprintf("test-scheme-%d", schemeRuns)
	registry.RegisterScheme(scheme, open)
	r, err := registry.Open(context.Background(), strings.ToUpper(scheme)+"://x")
	if err != nil {
		t.Fatalf("Open with a registered scheme in upper case: %v", err)
	}
	r.Close()
}

func TestPrefixAndHosts(t *testing.T) {
	tests := []struct {
		url    string
		prefix string
		hosts  string
	}{
		{"etcd://h1:2379,h2:2379/services", "/services", "h1:2379|h2:2379"},
		{"zk://127.0.0.1:2181", "/services", "127.0.0.1:2181"},
		{"zk://127.0.0.1:2181/", "/services", "127.0.0.1:2181"},
		{"etcd://h1:2379/dabb/prod/", "/dabb/prod", "h1:2379"},
		{"etcd://h1:2379,,h2:2379//a/../b", "/b", "h1:2379|h2:2379"},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			u, err := url.Parse(tt.url)
			if err != nil {
				t.Fatal(err)
			}
			if got := registry.PrefixOf(u); got != tt.prefix {
				t.Errorf("PrefixOf = %q, want %q", got, tt.prefix)
			}
			if got := strings.Join(registry.HostsOf(u), "|"); got != tt.hosts {
				t.Errorf("HostsOf = %q, want %q", got, tt.hosts)
			}
		})
	}
}
