// The rules for service names, instance IDs and instances, and comparisons of instance sets.

package registry

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"
)

// ValidateService reports whether name can name a service in every
// backend: not empty, no '/', no control characters, not "." or "..".
func ValidateService(name string) error {
	if err := validName(name); err != nil {
		return fmt.Errorf("%w service name %q: %s", ErrInvalid, name, err)
	}
	return nil
}

// ValidateID reports whether id can name an instance in every backend:
// the same rules as a service name.
func ValidateID(id string) error {
	if err := validName(id); err != nil {
		return fmt.Errorf("%w instance id %q: %s", ErrInvalid, id, err)
	}
	return nil
}

// Validate reports whether the instance can be registered: a valid service
// name, an ID that is a valid name too (it becomes a key or node name), and
// an Addr of the form host:port.
func (in Instance) Validate() error {
	if err := ValidateService(in.Service); err != nil {
		return err
	}
	if err := validName(in.ID); err != nil {
		return fmt.Errorf("%w instance id %q of %s: %s", ErrInvalid, in.ID, in.Service, err)
	}
	if in.Addr == "" {
		return fmt.Errorf("%w instance %s/%s: empty addr", ErrInvalid, in.Service, in.ID)
	}
	if _, _, err := net.SplitHostPort(in.Addr); err != nil {
		return fmt.Errorf("%w instance %s/%s: addr %q: %v", ErrInvalid, in.Service, in.ID, in.Addr, err)
	}
	return nil
}

type nameError string

func (e nameError) Error() string { return string(e) }

func validName(s string) error {
	switch {
	case s == "":
		return nameError("empty")
	case s == "." || s == "..":
		return nameError("reserved")
	case strings.ContainsRune(s, '/'):
		return nameError("contains '/'")
	case strings.IndexFunc(s, func(r rune) bool { return r < 0x20 || r == 0x7f }) >= 0:
		return nameError("contains a control character")
	}
	return nil
}

// EqualSets reports whether a and b hold the same instances, in any order:
// the same IDs with the same service, address, effective weight and
// metadata (a nil map equals an empty one).
func EqualSets(a, b []Instance) bool {
	if len(a) != len(b) {
		return false
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
