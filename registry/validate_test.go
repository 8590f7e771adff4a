// Tests of the validation rules.

package registry_test

import (
	"errors"
	"testing"

	"github.com/dabbrpc/dabb/registry"
)

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
