// Tests of instance-set comparisons.

package registry_test

import (
	"testing"

	"github.com/dabbrpc/dabb/registry"
)

func TestEqualSets(t *testing.T) {
	a := registry.Instance{Service: "s", ID: "a", Addr: "h:1"}
	b := registry.Instance{Service: "s", ID: "b", Addr: "h:2", Metadata: map[string]string{"v": "1"}}
	w100 := a
	w100.Weight = 100
	bOther := b
	bOther.Metadata = map[string]string{"v": "2"}
	c := registry.Instance{Service: "s", ID: "c", Addr: "h:2", Metadata: map[string]string{"v": "1"}}
	aAddr := a
	aAddr.Addr = "h:9"
	emptyMD := a
	emptyMD.Metadata = map[string]string{}
	tests := []struct {
		name string
		x, y []registry.Instance
		want bool
	}{
		{"Sorted", []registry.Instance{a, b}, []registry.Instance{a, b}, true},
		{"SortedOtherID", []registry.Instance{a, b}, []registry.Instance{a, c}, false},
		{"SortedOtherAddr", []registry.Instance{a, b}, []registry.Instance{aAddr, b}, false},
		{"BothEmpty", nil, []registry.Instance{}, true},
		{"Order", []registry.Instance{a, b}, []registry.Instance{b, a}, true},
		{"DefaultWeight", []registry.Instance{a}, []registry.Instance{w100}, true},
		{"NilVsEmptyMetadata", []registry.Instance{a}, []registry.Instance{emptyMD}, true},
		{"Metadata", []registry.Instance{a, b}, []registry.Instance{a, bOther}, false},
		{"Length", []registry.Instance{a}, []registry.Instance{a, b}, false},
		{"DuplicateIDs", []registry.Instance{a, a}, []registry.Instance{a, b}, false},
		{"DuplicateIDsOnlyInSecond", []registry.Instance{a, b}, []registry.Instance{a, a}, false},
		{"SameDuplicates", []registry.Instance{a, a}, []registry.Instance{a, a}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := registry.EqualSets(tt.x, tt.y); got != tt.want {
				t.Fatalf("EqualSets = %v, want %v", got, tt.want)
			}
			if got := registry.EqualSets(tt.y, tt.x); got != tt.want {
				t.Fatalf("EqualSets with the arguments swapped = %v, want %v", got, tt.want)
			}
		})
	}
}
