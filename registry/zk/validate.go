// The node names ZooKeeper accepts for services and instances.

package zk

import (
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/dabbrpc/dabb/registry"
)

// validInstance checks an instance for registry-wide rules and for the
// characters ZooKeeper refuses in node names.
func validInstance(in registry.Instance) error {
	if err := in.Validate(); err != nil {
		return err
	}
	if err := validService(in.Service); err != nil {
		return err
	}
	return validID(in)
}

func validID(in registry.Instance) error {
	var why string
	switch id := in.ID; {
	case id == "":
		why = "empty"
	case id == "." || id == "..":
		why = "reserved"
	case strings.ContainsRune(id, '/'):
		why = "contains '/'"
	case strings.IndexFunc(id, func(c rune) bool { return c < 0x20 }) >= 0:
		why = "contains a control character"
	default:
		if err := checkName(id); err != nil {
			why = err.Error()
		}
	}
	if why != "" {
		return fmt.Errorf("%w instance id %q of %s: %s", registry.ErrInvalid, in.ID, in.Service, why)
	}
	return nil
}

func validService(service string) error {
	if err := registry.ValidateService(service); err != nil {
		return err
	}
	if err := checkName(service); err != nil {
		return fmt.Errorf("%w service name %q: %v", registry.ErrInvalid, service, err)
	}
	return nil
}

// checkName reports characters ZooKeeper does not allow in a node name
// beyond those registry.ValidateService rejects.
func checkName(s string) error {
	if !utf8.ValidString(s) {
		return errors.New("not valid UTF-8")
	}
	for _, c := range s {
		switch {
		case c == 0x7f || c >= 0x80 && c <= 0x9f,
			c >= 0xd800 && c <= 0xf8ff,
			c >= 0xfff0:
			// ZooKeeper checks the name's UTF-16 units: a character
			// beyond U+FFFF is a surrogate pair, in the refused range.
			return fmt.Errorf("character %U is not allowed in a ZooKeeper node name", c)
		}
	}
	return nil
}

// checkPath checks a cleaned absolute path, such as the prefix.
func checkPath(p string) error {
	for part := range strings.SplitSeq(strings.TrimPrefix(p, "/"), "/") {
		if err := checkName(part); err != nil {
			return err
		}
		if part == "" || strings.IndexFunc(part, func(c rune) bool { return c < 0x20 }) >= 0 {
			return errors.New("empty component or control character")
		}
	}
	if p == "/zookeeper" || strings.HasPrefix(p, "/zookeeper/") {
		return errors.New("/zookeeper is reserved by ZooKeeper")
	}
	return nil
}
