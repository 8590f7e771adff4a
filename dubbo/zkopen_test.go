package dubbo

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

func TestOpenURL(t *testing.T) {
	ctx := context.Background()
	bad := []struct{ url, want string }{
		{"zookeeper://127.0.0.1:2181/dubbo", "?group=dubbo"},
		{"zookeeper://127.0.0.1:2181/a/b", "?group=a/b"},
		{"zookeeper://127.0.0.1:2181?check=false", `unknown zookeeper:// parameter "check"`},
		{"zookeeper://127.0.0.1:2181?timeout=0", "positive number of milliseconds"},
		{"zookeeper://127.0.0.1:2181?session=10s", "positive number of milliseconds"},
		{"zookeeper://127.0.0.1:2181?group=", "group is empty"},
		{"zookeeper://127.0.0.1:2181?group=a&group=b", "given 2 times"},
		{"zookeeper://127.0.0.1:2181?group=zookeeper", "reserved"},
		{"zookeeper://u:p@127.0.0.1:2181", "credentials"},
		{"zookeeper://", "no servers"},
	}
	for _, tt := range bad {
		r, err := registry.Open(ctx, tt.url)
		if err == nil {
			r.Close()
			t.Errorf("Open(%q) succeeded", tt.url)
			continue
		}
		if !errors.Is(err, registry.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Open(%q) = %v; want ErrInvalid saying %q", tt.url, err, tt.want)
		}
	}
	r, err := registry.Open(ctx, "zookeeper://10.0.0.1:2181?backup=10.0.0.2:2181,10.0.0.3:2181&group=estate&timeout=1500&session=20000")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cfg := r.(*Registry).Config()
	if got := strings.Join(cfg.Servers, ","); got != "10.0.0.1:2181,10.0.0.2:2181,10.0.0.3:2181" {
		t.Errorf("servers %s", got)
	}
	if cfg.Root != "/estate" || cfg.RequestTimeout != 1500*time.Millisecond || cfg.SessionTimeout != 20*time.Second {
		t.Errorf("config %+v", cfg)
	}
	d, err := registry.Open(ctx, "zookeeper://10.0.0.1:2181")
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if cfg := d.(*Registry).Config(); cfg.Root != DefaultRoot {
		t.Errorf("default root %q, want %q", cfg.Root, DefaultRoot)
	}
}
