// Package proto is dabb's protobuf codec: serialization id 22 (Apache
// Dubbo's protobuf id), name "proto". Payloads are the standard protobuf
// binary encoding of one message.
//
// Import it for its side effect; the codec registers itself:
//
//	import _ "github.com/dabbrpc/dabb/codec/proto"
//
//	c, _ := codec.ByName("proto") // or codec.ByID(22) on a server
//	buf, err := c.Marshal(buf[:0], req) // req is a proto.Message
//	err = c.Unmarshal(payload, reply)
//
// Values must implement google.golang.org/protobuf/proto.Message (generated
// message pointers do); anything else is refused with [ErrNotMessage].
package proto

import (
	"errors"
	"fmt"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/internal/bufpool"
	pb "google.golang.org/protobuf/proto"
)

// ID is the serialization id written in the header: Dubbo's protobuf id.
const ID byte = 22

// Name is the codec's configuration name.
const Name = "proto"

// ErrNotMessage is returned (wrapped, naming the Go type) when a value is
// not a proto.Message, or when Unmarshal is given a nil message to decode
// into. A nil message pointer marshals as the empty message, as protobuf-go
// itself does, so a nil request or a handler's nil reply travels empty.
var ErrNotMessage = errors.New("codec/proto: not a proto.Message")

func init() { codec.Register(Codec{}) }

// Codec encodes and decodes protobuf messages. The zero value is ready to
// use; the registered instance is found with codec.ByID(22) or
// codec.ByName("proto").
type Codec struct{}

var _ codec.Codec = Codec{}

// ID returns 22.
func (Codec) ID() byte { return ID }

// Name returns "proto".
func (Codec) Name() string { return Name }

// Marshal appends the protobuf encoding of v, which must be a
// proto.Message, to dst. When dst has room it allocates nothing of its own.
// A new buffer for a result of 64 KiB or more comes from the shared pool of
// large buffers; the transport returns it there after writing it.
func (Codec) Marshal(dst []byte, v any) ([]byte, error) {
	m, ok := v.(pb.Message)
	if !ok {
		return dst, fmt.Errorf("%w: marshal %T (for plain Go types use another codec, e.g. proxy.WithCodec(\"json\"))", ErrNotMessage, v)
	}
	// Size fills the message's size cache, which MarshalAppend would
	// compute anyway; with UseCachedSize it is not computed twice.
	if n := len(dst) + (pb.MarshalOptions{}).Size(m); n > cap(dst) && n >= bufpool.Min {
		grown := bufpool.Get(n)[:len(dst)]
		copy(grown, dst)
		dst = grown
	}
	out, err := pb.MarshalOptions{UseCachedSize: true}.MarshalAppend(dst, m)
	if err != nil {
		return dst, fmt.Errorf("codec/proto: marshal %T: %w", v, err)
	}
	return out, nil
}

// Unmarshal decodes data into v, which must be a non-nil proto.Message; v
// is reset first. The result does not alias data: string, bytes and
// unknown fields are copied, so data may be reused as soon as Unmarshal
// returns.
func (Codec) Unmarshal(data []byte, v any) error {
	m, ok := v.(pb.Message)
	if !ok {
		return fmt.Errorf("%w: unmarshal into %T", ErrNotMessage, v)
	}
	if m == nil || !m.ProtoReflect().IsValid() {
		return fmt.Errorf("%w: unmarshal into nil %T", ErrNotMessage, v)
	}
	if err := pb.Unmarshal(data, m); err != nil {
		return fmt.Errorf("codec/proto: unmarshal %T: %w", v, err)
	}
	return nil
}
