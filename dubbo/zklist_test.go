package dubbo_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/dubbo"
	"github.com/dabbrpc/dabb/dubbo/internal/dubbogotest"
	"github.com/dabbrpc/dabb/internal/zktest"
	"github.com/dabbrpc/dabb/proxy"
	"github.com/dabbrpc/dabb/registry"
)

// TestRegistryServices lists the service keys of dubbo-go providers, one
// of them in a group and a version, and asks each with $echo.
func TestRegistryServices(t *testing.T) {
	srv := zktest.Shared(t)
	plain := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr()})
	defer stopProvider(t, srv.Addr(), plain)
	blue := dubbogotest.StartProvider(t, dubbogotest.ProviderConfig{ZooKeeper: srv.Addr(), Group: "blue", Version: "2.0.0",
		Services: []string{"greeter"}})
	defer stopProvider(t, srv.Addr(), blue)
	ctx := context.Background()
	r, err := registry.Open(ctx, "zookeeper://"+srv.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	keys, err := r.(registry.Lister).Services(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"blue/com.example.Greeter:2.0.0", "com.example.Greeter", "com.example.inventory.InventoryService"} {
		if !slices.Contains(keys, want) {
			t.Errorf("Services = %q; want %s among them", keys, want)
		}
	}
	if !slices.IsSorted(keys) {
		t.Errorf("Services = %q; want them sorted", keys)
	}
	for _, k := range keys {
		iface, group, version, err := dubbo.SplitServiceKey(k)
		if err != nil || iface == "" {
			t.Errorf("SplitServiceKey(%q) = %q, %q, %q, %v", k, iface, group, version, err)
		}
	}

	c := newDubboClient(t, srv.Addr())
	for _, k := range []string{"blue/com.example.Greeter:2.0.0", "com.example.Greeter"} {
		if err := dubbo.Echo(ctx, c, k, proxy.Timeout(5*time.Second)); err != nil {
			t.Errorf("Echo(%s) = %v", k, err)
		}
	}
}
