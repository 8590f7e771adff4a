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
	open := func(context.Context, *url.URL) (registry.Registry, error) { return static.New(), nil }
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

func TestValidate(t *testing.T) {
	tests := []struct {
		name string
		in   registry.Instance
		ok   bool
	}{
		{"Good", registry.Instance{Service: "a.A", ID: "10.0.0.1:1", Addr: "10.0.0.1:1"}, true},
		{"IPv6", registry.Instance{Service: "a.A", ID: "x", Addr: "[::1]:1"}, true},
		{"NoService", registry.Instance{ID: "x", Addr: "h:1"}, false},
		{"SlashService", registry.Instance{Service: "a/A", ID: "x", Addr: "h:1"}, false},
		{"DotDotID", registry.Instance{Service: "a.A", ID: "..", Addr: "h:1"}, false},
		{"ControlID", registry.Instance{Service: "a.A", ID: "x\n", Addr: "h:1"}, false},
		{"NoPort", registry.Instance{Service: "a.A", ID: "x", Addr: "h"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.in.Validate()
			if (err == nil) != tt.ok {
				t.Fatalf("Validate(%+v) = %v, want ok=%v", tt.in, err, tt.ok)
			}
			if err != nil && !errors.Is(err, registry.ErrInvalid) {
				t.Fatalf("error %v does not wrap ErrInvalid", err)
			}
		})
	}
}

func TestEqualSets(t *testing.T) {
	a := registry.Instance{Service: "s", ID: "a", Addr: "h:1"}
	b := registry.Instance{Service: "s", ID: "b", Addr: "h:2", Metadata: map[string]string{"v": "1"}}
	w100 := a
	w100.Weight = 100
	bOther := b
	bOther.Metadata = map[string]string{"v": "2"}
	emptyMD := a
	emptyMD.Metadata = map[string]string{}
	tests := []struct {
		name string
		x, y []registry.Instance
		want bool
	}{
		{"BothEmpty", nil, []registry.Instance{}, true},
		{"Order", []registry.Instance{a, b}, []registry.Instance{b, a}, true},
		{"DefaultWeight", []registry.Instance{a}, []registry.Instance{w100}, true},
		{"NilVsEmptyMetadata", []registry.Instance{a}, []registry.Instance{emptyMD}, true},
		{"Metadata", []registry.Instance{a, b}, []registry.Instance{a, bOther}, false},
		{"Length", []registry.Instance{a}, []registry.Instance{a, b}, false},
		{"DuplicateIDs", []registry.Instance{a, a}, []registry.Instance{a, b}, false},
		{"DuplicateIDsOnlyInSecond", []registry.Instance{a, b}, []registry.Instance{a, a}, false},
		{"SameDuplicates", []registry.Instance{a, a}, []registry.Instance{a, a}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := registry.EqualSets(tt.x, tt.y); got != tt.want {
				t.Fatalf("EqualSets = %v, want %v", got, tt.want)
			}
			if got := registry.EqualSets(tt.y, tt.x); got != tt.want {
				t.Fatalf("EqualSets with the arguments swapped = %v, want %v", got, tt.want)
			}
		})
	}
}
