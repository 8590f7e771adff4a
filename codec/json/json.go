// Package json is dabb's JSON codec: serialization id 16, name "json".
// Payloads are plain JSON (encoding/json), one value per payload, with no
// type names and no trailing newline.
//
// Import it for its side effect; the codec registers itself:
//
//	import _ "github.com/dabbrpc/dabb/codec/json"
//
//	c, _ := codec.ByName("json") // or codec.ByID(16) on a server
//	buf, err := c.Marshal(buf[:0], req)
//	err = c.Unmarshal(payload, &reply)
//
// # Why id 16
//
// The header's five-bit serialization id says how a payload is encoded,
// and Apache Dubbo already numbers its JSON serializations: 6 fastjson,
// 16 Gson, 21 protobuf-json, 23 fastjson2. Fastjson2 (23) writes JSONB, a
// binary form carrying Java class names, and protobuf-json (21) covers
// protobuf messages only. Fastjson (6) and Gson (16) both write each value
// as plain JSON text without type names (content type "text/json"); of the
// two, Gson's output with its default settings is standard JSON as
// encoding/json writes it, with no library-specific features switched on,
// so this codec takes 16. A Gson writer ends each value with a newline;
// Unmarshal accepts such trailing white space.
//
// # Unknown fields
//
// Unmarshal ignores an object's member that the Go type has no field
// for, as encoding/json does. UnmarshalStrict refuses it, naming it: a
// dabb server decodes requests so, and a typo in a request's field name
// is an error rather than an empty field. Replies are decoded with
// Unmarshal, so a client still reads the answer of a newer server that
// added a field. dabb.WithLaxJSON makes a server accept unknown fields.
package json

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/dabbrpc/dabb/codec"
)

// ID is the serialization id written in the header: Dubbo's Gson
// (plain JSON) id.
const ID byte = 16

// Name is the codec's configuration name.
const Name = "json"

func init() { codec.Register(Codec{}) }

// Codec encodes values with encoding/json. The zero value is ready to use;
// the registered instance is found with codec.ByID(16) or
// codec.ByName("json").
type Codec struct{}

var _ codec.Strict = Codec{}

// ID returns 16.
func (Codec) ID() byte { return ID }

// Name returns "json".
func (Codec) Name() string { return Name }

// Marshal appends the JSON encoding of v to dst. encoding/json builds the
// text in its own buffer, so Marshal allocates once for the result even
// when dst has room.
func (Codec) Marshal(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return dst, fmt.Errorf("codec/json: marshal %T: %w", v, err)
	}
	return append(dst, b...), nil
}

// Unmarshal decodes the JSON in data into v, which must be a non-nil
// pointer. The result does not alias data (encoding/json copies strings,
// byte slices and json.RawMessage), so data may be reused at once.
func (Codec) Unmarshal(data []byte, v any) error {
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("codec/json: unmarshal into %T: %w", v, err)
	}
	return nil
}

// UnmarshalStrict decodes the JSON in data into v as Unmarshal does, and
// fails for an object member that v's type has no field for. Its error
// names the member: json: unknown field "customr". Field names match
// without case, as in Unmarshal. On an error v may be partly filled.
func (Codec) UnmarshalStrict(data []byte, v any) error {
	d := json.NewDecoder(bytes.NewReader(data))
	d.DisallowUnknownFields()
	err := d.Decode(v)
	switch {
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF):
		// No value or a cut one: Unmarshal's error says so in its own
		// words, and it checks the whole input before it fills v.
		err = json.Unmarshal(data, v)
	case err == nil && len(bytes.TrimLeft(data[d.InputOffset():], " \t\r\n")) > 0:
		// The decoder stops after the first value; Unmarshal refuses
		// anything but white space after it.
		err = json.Unmarshal(data, v)
	}
	if err != nil {
		return fmt.Errorf("codec/json: unmarshal into %T: %w", v, err)
	}
	return nil
}
