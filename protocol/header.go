// The 16-byte Header and its Flags, with accessors.

package protocol

import (
	"encoding/binary"
)

// Magic is the first two bytes of every frame.
const Magic uint16 = 0xdabb

// HeaderLen is the size of a frame header in bytes.
const HeaderLen = 16

// DefaultMaxBody is the default limit on a frame's body length: 8 MiB.
const DefaultMaxBody uint32 = 8 << 20

// Flags is the third byte of the header.
type Flags byte

const (
	// FlagRequest marks a request; responses leave it clear.
	FlagRequest Flags = 0x80
	// FlagTwoWay marks a request that expects a response.
	FlagTwoWay Flags = 0x40
	// FlagEvent marks an event frame (heartbeat, read-only).
	FlagEvent Flags = 0x20
	// SerializationMask selects the serialization id in the low five bits.
	SerializationMask Flags = 0x1f
)

// IsRequest reports whether the request bit is set.
func (f Flags) IsRequest() bool { return f&FlagRequest != 0 }

// IsTwoWay reports whether the two-way bit is set.
func (f Flags) IsTwoWay() bool { return f&FlagTwoWay != 0 }

// IsEvent reports whether the event bit is set.
func (f Flags) IsEvent() bool { return f&FlagEvent != 0 }

// Serialization returns the serialization id in the low five bits.
func (f Flags) Serialization() byte { return byte(f & SerializationMask) }

// MakeFlags builds a flag byte from a kind (any of FlagRequest, FlagTwoWay,
// FlagEvent) and a serialization id, which is masked to five bits.
func MakeFlags(kind Flags, serialization byte) Flags {
	return kind&^SerializationMask | Flags(serialization)&SerializationMask
}

// Header is the fixed 16-byte frame header. The zero value is not valid
// until the magic is set; AppendMessage sets it.
type Header [HeaderLen]byte

// Magic returns bytes 0-1.
func (h *Header) Magic() uint16 { return binary.BigEndian.Uint16(h[0:2]) }

// Flags returns byte 2.
func (h *Header) Flags() Flags { return Flags(h[2]) }

// Status returns byte 3.
func (h *Header) Status() Status { return Status(h[3]) }

// ID returns the request id, bytes 4-11.
func (h *Header) ID() uint64 { return binary.BigEndian.Uint64(h[4:12]) }

// BodyLen returns the body length, bytes 12-15.
func (h *Header) BodyLen() uint32 { return binary.BigEndian.Uint32(h[12:16]) }

// SetMagic writes the magic into bytes 0-1.
func (h *Header) SetMagic() { binary.BigEndian.PutUint16(h[0:2], Magic) }

// SetFlags sets byte 2.
func (h *Header) SetFlags(f Flags) { h[2] = byte(f) }

// SetStatus sets byte 3.
func (h *Header) SetStatus(s Status) { h[3] = byte(s) }

// SetID sets the request id.
func (h *Header) SetID(id uint64) { binary.BigEndian.PutUint64(h[4:12], id) }

// SetBodyLen sets the body length.
func (h *Header) SetBodyLen(n uint32) { binary.BigEndian.PutUint32(h[12:16], n) }

// Init sets every field but the body length, which AppendMessage fills in.
func (h *Header) Init(f Flags, s Status, id uint64) {
	h.SetMagic()
	h.SetFlags(f)
	h.SetStatus(s)
	h.SetID(id)
}
