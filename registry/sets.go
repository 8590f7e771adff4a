// Instance sets: comparing, copying and sorting them.

package registry

import (
	"maps"
	"slices"
	"strings"
	"unsafe"
)

// EqualSets reports whether a and b hold the same instances, in any order:
// the same IDs with the same service, address, effective weight and
// metadata (a nil map equals an empty one).
func EqualSets(a, b []Instance) bool {
	if len(a) != len(b) {
		return false
	}
	if SortedByID(a) && SortedByID(b) {
		// Sets in the order backends and caches keep them, IDs distinct:
		// compared side by side, without building a map.
		for i := range a {
			if !SameInstance(a[i], b[i]) {
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
		if !ok || !SameInstance(x, in) {
			return false
		}
	}
	return true
}

// SortedByID reports whether the IDs of list are strictly increasing, the
// order in which watchers return their sets.
func SortedByID(list []Instance) bool {
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
		if !SameInstance(a[i], b[i]) {
			return false
		}
	}
	return true
}

// SameInstance reports whether a and b are the same instance: the same
// service, ID, address, effective weight and metadata (a nil map equals an
// empty one). The strings and maps of an unchanged instance are usually
// shared between the sets a watcher returns, so most comparisons end at a
// pointer.
func SameInstance(a, b Instance) bool {
	return a.Service == b.Service && a.ID == b.ID && a.Addr == b.Addr &&
		a.EffectiveWeight() == b.EffectiveWeight() && sameMetadata(a.Metadata, b.Metadata)
}

// sameMetadata is maps.Equal, at once when both are the very same map.
func sameMetadata(a, b map[string]string) bool {
	// A map value is a pointer to its header: equal pointers, same map.
	if *(*unsafe.Pointer)(unsafe.Pointer(&a)) == *(*unsafe.Pointer)(unsafe.Pointer(&b)) {
		return true
	}
	return maps.Equal(a, b)
}

// CompareInstances orders instances by ID, then Addr: the order of
// SortedCopy.
func CompareInstances(a, b Instance) int {
	if c := strings.Compare(a.ID, b.ID); c != 0 {
		return c
	}
	return strings.Compare(a.Addr, b.Addr)
}

// CloneSet copies a set deeply (the Metadata maps too), never returning
// nil. A watcher may return such a copy, but need not: its caller must not
// write the Metadata maps of a set from Next.
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
	slices.SortFunc(out, CompareInstances)
	return out
}
