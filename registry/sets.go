// Instance sets: comparing, copying and sorting them.

package registry

import (
	"maps"
	"slices"
	"strings"
)

// EqualSets reports whether a and b hold the same instances, in any order:
// the same IDs with the same service, address, effective weight and
// metadata (a nil map equals an empty one).
func EqualSets(a, b []Instance) bool {
	if len(a) != len(b) {
		return false
	}
	if sortedByID(a) && sortedByID(b) {
		// Sets in the order backends and caches keep them, IDs distinct:
		// compared side by side, without building a map.
		for i := range a {
			if !sameInstance(a[i], b[i]) {
				return false
			}
		}
		return true
	}
	byID := make(map[string]Instance, len(a))
	for _, in := range a {
		byID[in.ID] = in
	}
	if len(byID) != len(a) || !distinctIDs(b) {
		return equalSorted(a, b)
	}
	for _, in := range b {
		x, ok := byID[in.ID]
		if !ok || !sameInstance(x, in) {
			return false
		}
	}
	return true
}

// sortedByID reports whether the IDs of list are strictly increasing.
func sortedByID(list []Instance) bool {
	for i := 1; i < len(list); i++ {
		if list[i-1].ID >= list[i].ID {
			return false
		}
	}
	return true
}

// distinctIDs reports whether no ID repeats in list.
func distinctIDs(list []Instance) bool {
	seen := make(map[string]struct{}, len(list))
	for _, in := range list {
		if _, dup := seen[in.ID]; dup {
			return false
		}
		seen[in.ID] = struct{}{}
	}
	return true
}

// equalSorted compares two lists that may repeat IDs, after sorting.
func equalSorted(a, b []Instance) bool {
	a, b = SortedCopy(a), SortedCopy(b)
	for i := range a {
		if !sameInstance(a[i], b[i]) {
			return false
		}
	}
	return true
}

func sameInstance(a, b Instance) bool {
	return a.Service == b.Service && a.ID == b.ID && a.Addr == b.Addr &&
		a.EffectiveWeight() == b.EffectiveWeight() && maps.Equal(a.Metadata, b.Metadata)
}

// CloneSet copies a set deeply (the Metadata maps too), never returning
// nil, so that a watcher's caller may change what it got without changing
// the backend's state.
func CloneSet(set []Instance) []Instance {
	out := make([]Instance, len(set))
	for i, in := range set {
		in.Metadata = maps.Clone(in.Metadata)
		out[i] = in
	}
	return out
}

// SortedCopy returns a copy of the list sorted by ID, then Addr. Backends
// return their sets in this order.
func SortedCopy(in []Instance) []Instance {
	out := slices.Clone(in)
	slices.SortFunc(out, func(a, b Instance) int {
		if c := strings.Compare(a.ID, b.ID); c != 0 {
			return c
		}
		return strings.Compare(a.Addr, b.Addr)
	})
	return out
}
