package proxy

import (
	"fmt"
	"log/slog"
	"slices"
	"testing"

	"github.com/dabbrpc/dabb/balancer"
	"github.com/dabbrpc/dabb/registry"
	"github.com/dabbrpc/dabb/registry/static"
)

// TestAddressesLeavingEveryListAreForgotten: the breaker of an address is
// dropped once no service lists it any more, and kept while one does.
func TestAddressesLeavingEveryListAreForgotten(t *testing.T) {
	c, err := NewClient(static.New(), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ins := func(addrs ...string) []registry.Instance {
		var l []registry.Instance
		for _, a := range addrs {
			l = append(l, registry.Instance{Service: "s", ID: a, Addr: a})
		}
		return l
	}
	const a, b = "10.0.0.1:20880", "10.0.0.2:20880"
	has := func(addr string) bool { return (*c.breakers.m.Load())[addr] != nil }
	c.listed("s1", ins(a, b))
	c.listed("s2", ins(b))
	c.breakers.get(a)
	c.breakers.get(b)

	c.listed("s1", ins(b))
	if has(a) {
		t.Error("the breaker of an address no service lists is kept")
	}
	if !has(b) {
		t.Error("the breaker of an address still listed was dropped")
	}
	c.listed("s2", nil)
	if !has(b) {
		t.Error("dropped while s1 still lists it")
	}
	c.listed("s1", nil)
	if has(b) {
		t.Error("kept after the last service stopped listing it")
	}
}

// listClient returns a client and the state of a service it follows,
// with the default balancer, for feeding lists to onList. The client is
// closed when the test ends.
func listClient(tb testing.TB) (*Client, *serviceState) {
	tb.Helper()
	c, err := NewClient(static.New(), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = c.Close() })
	bal, err := balancer.New("", balancer.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return c, &serviceState{bal: bal}
}

// BenchmarkListChange measures what the client does with a new list of a
// service's instances: 5,000 of them, one coming or going each time, as
// the registry cache delivers them.
func BenchmarkListChange(b *testing.B) {
	c, st := listClient(b)
	full := make([]registry.Instance, 5001)
	for i := range full {
		full[i] = registry.Instance{Service: "s", ID: fmt.Sprintf("i%05d", i), Addr: fmt.Sprintf("10.0.%d.%d:20880", i/250, i%250+1),
			Metadata: map[string]string{"zone": "z1"}}
	}
	fewer := slices.Delete(slices.Clone(full), 2500, 2501)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if i++; i%2 == 0 {
			c.onList("s", st, full)
		} else {
			c.onList("s", st, fewer)
		}
	}
}

// TestListChangesFollowAddresses: across sorted lists (compared side by
// side) and unsorted ones, an address is listed while an instance of the
// service is at it, and the TLS name of an instance whose Metadata
// changed is noted.
func TestListChangesFollowAddresses(t *testing.T) {
	c, st := listClient(t)
	const x, y, z = "10.0.0.1:1", "10.0.0.2:1", "10.0.0.3:1"
	a, b, d := registry.Instance{ID: "a", Addr: x}, registry.Instance{ID: "b", Addr: x}, registry.Instance{ID: "d", Addr: y}
	bz := b
	bz.Addr = z
	dn := d
	dn.Metadata = map[string]string{MetadataTLSServerName: "d.example"}
	steps := []struct {
		what   string
		list   []registry.Instance
		listed []string
	}{
		{"first", []registry.Instance{a, b, d}, []string{x, y}},
		{"a gone, x still b's", []registry.Instance{b, d}, []string{x, y}},
		{"b moved to z", []registry.Instance{bz, d}, []string{y, z}},
		{"unsorted", []registry.Instance{d, bz, a}, []string{x, y, z}},
		{"sorted again, d retagged", []registry.Instance{a, dn}, []string{x, y}},
		{"empty", nil, nil},
	}
	for _, s := range steps {
		c.onList("s", st, s.list)
		for _, addr := range []string{x, y, z} {
			if got, want := c.lists("s", addr), slices.Contains(s.listed, addr); got != want {
				t.Fatalf("%s: lists(%s) = %v, want %v", s.what, addr, got, want)
			}
		}
		if s.what == "sorted again, d retagged" && c.serverName(nil)(y) != "d.example" {
			t.Fatalf("%s: TLS name of %s = %q", s.what, y, c.serverName(nil)(y))
		}
	}
	if len(c.addrs["s"].addrs) != 0 || c.serverName(nil)(y) != "" {
		t.Fatalf("after the empty list: addresses %v, TLS name of %s %q", c.addrs["s"].addrs, y, c.serverName(nil)(y))
	}
}

// listed records that service lists ins now, as onList does after its
// balancer took them.
func (c *Client) listed(service string, ins []registry.Instance) {
	c.apply(service, ins, c.diff(service, ins))
}
