// The rules for service names, instance IDs and instances.

package registry

import (
	"fmt"
	"net"
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
