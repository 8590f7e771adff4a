// Tests of etcd:// URLs.

package etcd

import (
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/etcdtest"
	"github.com/dabbrpc/dabb/registry"
)

func TestOpen(t *testing.T) {
	srv := etcdtest.Shared(t)
	ctx := ctxFor(t, 10*time.Second)
	tests := []struct {
		url     string
		wantErr bool
	}{
		{url: "etcd://" + srv.Endpoint() + "/custom-root?ttl=5s&timeout=2s"},
		{url: "etcd://" + srv.Endpoint() + ",127.0.0.1:1/custom-root"},
		{url: "etcd:///custom-root", wantErr: true},
		{url: "etcd://" + srv.Endpoint() + "/x?ttl=soon", wantErr: true},
		{url: "etcd://" + srv.Endpoint() + "/x?bogus=1", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.url, func(t *testing.T) {
			r, err := registry.Open(ctx, tt.url)
			if tt.wantErr {
				if err == nil {
					r.Close()
					t.Fatalf("Open(%q) succeeded, want an error", tt.url)
				}
				t.Logf("error: %v", err)
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer r.Close()
			in := registry.Instance{Service: service(t), ID: "a", Addr: "127.0.0.1:1"}
			if err := r.Register(ctx, in); err != nil {
				t.Fatal(err)
			}
			out, err := srv.Ctl(ctx, "get", "--keys-only", "/custom-root/"+in.Service+"/a")
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(out), "/custom-root/"+in.Service+"/a") {
				t.Fatalf("key not under the URL's prefix; etcdctl: %q", out)
			}
		})
	}
}
