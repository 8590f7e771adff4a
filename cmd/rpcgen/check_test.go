package main

import (
	"testing"

	"github.com/dabbrpc/dabb/registry"
)

// TestServiceNameRule holds rpcgen's copy of the service-name rule to
// registry's: the same names refused, with the same message.
func TestServiceNameRule(t *testing.T) {
	names := []string{
		"", ".", "..", "...", ".a", "a.", "inventory.Inventory", "shop/Orders", "/", "a/",
		"a\x00b", "a\tb", "a\nb", "\x1f", "a\x7f", "\u0080", "a b", "ünïcode.Svc", "a\\b", "-", "_",
	}
	for _, name := range names {
		want, got := registry.ValidateService(name), checkServiceName(name)
		switch {
		case (want == nil) != (got == nil):
			t.Errorf("%q: registry says %v, rpcgen says %v", name, want, got)
		case want != nil && want.Error() != got.Error():
			t.Errorf("%q: registry says %q, rpcgen says %q", name, want, got)
		}
	}
}
