// Tests of opening a Registry by URL.

package zk

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/registrytest"
)

func TestOpenURL(t *testing.T) {
	good := []struct {
		url  string
		want Config
	}{
		{"zk://h1:2181,h2:2181/services", Config{Servers: []string{"h1:2181", "h2:2181"}, Prefix: "/services",
			SessionTimeout: DefaultSessionTimeout, RequestTimeout: DefaultRequestTimeout}},
		{"zk://h1:2181", Config{Servers: []string{"h1:2181"}, Prefix: "/services",
			SessionTimeout: DefaultSessionTimeout, RequestTimeout: DefaultRequestTimeout}},
		{"zk://h1:2181/dabb/prod/?session_timeout=2s&request_timeout=500ms", Config{Servers: []string{"h1:2181"}, Prefix: "/dabb/prod",
			SessionTimeout: 2 * time.Second, RequestTimeout: 500 * time.Millisecond}},
	}
	for _, tt := range good {
		t.Run(tt.url, func(t *testing.T) {
			rr, err := registry.Open(context.Background(), tt.url)
			if err != nil {
				t.Fatal(err)
			}
			defer rr.Close()
			r, ok := rr.(*Registry)
			if !ok {
				t.Fatalf("Open returned %T", rr)
			}
			got := r.Config()
			if strings.Join(got.Servers, ",") != strings.Join(tt.want.Servers, ",") || got.Prefix != tt.want.Prefix ||
				got.SessionTimeout != tt.want.SessionTimeout || got.RequestTimeout != tt.want.RequestTimeout {
				t.Fatalf("config = %+v, want %+v", got, tt.want)
			}
		})
	}
	bad := []string{
		"zk:///services",
		"zk://h1:2181/services?session_timeout=soon",
		"zk://h1:2181/services?session_timeout=-1s",
		"zk://h1:2181/services?sessiontimeout=1s",
		"zk://user:pw@h1:2181/services",
		"zk://h1:2181/zookeeper",
	}
	for _, u := range bad {
		t.Run(u, func(t *testing.T) {
			if r, err := registry.Open(context.Background(), u); err == nil {
				r.Close()
				t.Fatalf("Open(%q) succeeded", u)
			}
		})
	}
}

func TestConformanceByURL(t *testing.T) {
	addr := zktest.Shared(t).Addr()
	registrytest.Run(t, func(t *testing.T) registry.Registry {
		r, err := registry.Open(context.Background(), "zk://"+addr+"/dabb-url-test/services?session_timeout=4s&request_timeout=2s")
		if err != nil {
			t.Fatal(err)
		}
		return r
	})
}
