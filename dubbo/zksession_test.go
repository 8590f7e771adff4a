package dubbo

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/registry"
)

func TestCacheSaysZooKeeperUnreachable(t *testing.T) {
	// A port nothing listens on.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := newTestRegistry(t, "zookeeper://"+addr)
	c := registry.NewCache(r, registry.CacheConfig{Logger: slog.New(slog.DiscardHandler)})
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ins, err := c.Instances(ctx, "com.x.G")
	if err == nil {
		t.Fatalf("Instances = %v, want an error", ins)
	}
	// InitialTimeout (500 ms) passes before RequestTimeout (3 s): the
	// cache asks the registry, which knows its connections fail.
	if msg := err.Error(); !errors.Is(err, registry.ErrUnavailable) || !strings.Contains(msg, "could not be reached") || !strings.Contains(msg, addr) {
		t.Fatalf("Instances with nothing at %s = %q; want ErrUnavailable saying %s could not be reached", addr, msg, addr)
	}
}
