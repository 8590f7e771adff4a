// Package codec turns call arguments and results into payload bytes, chosen
// by the serialization id in the frame header.
//
// Implementations live in subpackages and register themselves from init:
//
//	import _ "github.com/dabbrpc/dabb/codec/proto" // id 22, Dubbo's protobuf id
//	import _ "github.com/dabbrpc/dabb/codec/json"  // id 16, Dubbo's plain-JSON (gson) id
//
// and are found with [ByID] (servers, from the header) or [ByName] (clients,
// from their configuration).
package codec

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Codec encodes and decodes payloads.
type Codec interface {
	// ID is the serialization id written in the header's low five bits.
	ID() byte
	// Name is the codec's configuration name, e.g. "proto".
	Name() string
	// Marshal appends the encoding of v to dst and returns the result;
	// it allocates nothing of its own when dst has room.
	Marshal(dst []byte, v any) ([]byte, error)
	// Unmarshal decodes data into v. It does not keep data.
	Unmarshal(data []byte, v any) error
}

// ErrUnknown is returned (wrapped, with the id or name) for a codec that is
// not registered.
var ErrUnknown = errors.New("codec: unknown serialization")

type table struct {
	byID   [32]Codec
	byName map[string]Codec
}

var (
	mu      sync.Mutex // serialises Register
	current atomic.Pointer[table]
)

func init() { current.Store(&table{byName: map[string]Codec{}}) }

// Register makes a codec available by id and name. It is meant to be called
// from init; it panics on a nil codec, an id over 31, or an id or name that
// is already taken.
func Register(c Codec) {
	if c == nil {
		panic("codec: Register of nil codec")
	}
	id := c.ID()
	if id > 31 {
		panic(fmt.Sprintf("codec: id %d of %q does not fit in five bits", id, c.Name()))
	}
	mu.Lock()
	defer mu.Unlock()
	old := current.Load()
	if o := old.byID[id]; o != nil {
		panic(fmt.Sprintf("codec: id %d registered twice (%q and %q)", id, o.Name(), c.Name()))
	}
	if _, dup := old.byName[c.Name()]; dup {
		panic(fmt.Sprintf("codec: name %q registered twice", c.Name()))
	}
	next := &table{byID: old.byID, byName: make(map[string]Codec, len(old.byName)+1)}
	for k, v := range old.byName {
		next.byName[k] = v
	}
	next.byID[id] = c
	next.byName[c.Name()] = c
	current.Store(next)
}

// ByID returns the codec registered for a serialization id, or an error
// wrapping ErrUnknown that names the id.
func ByID(id byte) (Codec, error) {
	if id < 32 {
		if c := current.Load().byID[id]; c != nil {
			return c, nil
		}
	}
	for _, k := range known {
		if k.id == id {
			return nil, fmt.Errorf("%w: id %d: import _ %q to enable it", ErrUnknown, id, k.pkg)
		}
	}
	return nil, fmt.Errorf("%w: id %d", ErrUnknown, id)
}

// Known reports whether id is a codec that is registered, or one of dabb's
// own that the program did not import. Any other id is no codec of dabb's:
// a peer that sends it speaks another protocol (a Dubbo peer's hessian2).
// A frame of a known id is read in the body format registered for the id
// (protocol.RegisterBodyFormat), or in dabb's layout when it has none; an
// id with a format and no codec is not known.
func Known(id byte) bool {
	if id < 32 && current.Load().byID[id] != nil {
		return true
	}
	for _, k := range known {
		if k.id == id {
			return true
		}
	}
	return false
}

// known names the packages of dabb's own codecs, for the error of a
// process that receives or asks for one it did not import.
var known = []struct {
	id        byte
	name, pkg string
}{
	{16, "json", "github.com/dabbrpc/dabb/codec/json"},
	{22, "proto", "github.com/dabbrpc/dabb/codec/proto"},
}

// ByName returns the codec registered under name, or an error wrapping
// ErrUnknown that names it (and the package to import, for dabb's own).
func ByName(name string) (Codec, error) {
	if c, ok := current.Load().byName[name]; ok {
		return c, nil
	}
	for _, k := range known {
		if k.name == name {
			return nil, fmt.Errorf("%w: name %q: import _ %q to enable it", ErrUnknown, name, k.pkg)
		}
	}
	return nil, fmt.Errorf("%w: name %q", ErrUnknown, name)
}
