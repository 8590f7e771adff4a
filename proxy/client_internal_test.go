package proxy

import (
	"log/slog"
	"testing"

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
