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

// BenchmarkListChange measures what the client does with a new list of a
// service's instances: 5,000 of them, one coming or going each time, as
// the registry cache delivers them.
func BenchmarkListChange(b *testing.B) {
	c, err := NewClient(static.New(), WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	bal, err := balancer.New("", balancer.Config{})
	if err != nil {
		b.Fatal(err)
	}
	st := &serviceState{bal: bal}
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
