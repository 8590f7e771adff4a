// Dubbo's serialization ids, and the error answers a Dubbo peer can read.

package protocol

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"unicode/utf16"
)

// ErrUnknownSerialization is reported by a [Reader] for a request or
// response in a serialization its SetSerializations refuses. The frame
// was consumed whole and unread, so the stream is still in step; the
// error matches ErrMalformed too.
var ErrUnknownSerialization = fmt.Errorf("%w: serialization not spoken here", ErrMalformed)

// serializationNames are the names Dubbo gives its serialization ids.
var serializationNames = map[byte]string{
	2: "hessian2", 3: "java", 4: "compactedjava", 6: "fastjson", 7: "nativejava",
	8: "kryo", 9: "fst", 10: "native-hessian", 11: "avro", 12: "protostuff",
	16: "json", 21: "protobuf-json", 22: "protobuf", 23: "fastjson2",
}

// SerializationName returns the name of serialization id as Dubbo knows
// it, e.g. "hessian2" for 2, or "unknown" for an id it does not define.
func SerializationName(id byte) string {
	if n, ok := serializationNames[id]; ok {
		return n
	}
	return "unknown"
}

// AppendForeignError appends a response frame answering request id with
// status, whose body is msg written as Dubbo writes an error message in
// the request's serialization. It is for a peer whose request dabb did
// not read, so the peer still reads why. The body is a hessian2 string
// for hessian2 (2); a JSON string and a newline for fastjson (6) and
// json (16), whose Dubbo outputs write JSON text; the text itself
// otherwise.
// dabb's own error responses are written by AppendMessage.
func AppendForeignError(dst []byte, id uint64, serialization byte, status Status, msg string) []byte {
	start := len(dst)
	var h Header
	h.Init(MakeFlags(0, serialization), status, id)
	dst = append(dst, h[:]...)
	switch serialization {
	case Hessian2:
		dst = AppendHessianString(dst, msg)
	case 6, 16:
		b, _ := json.Marshal(msg) // a string always encodes
		dst = append(dst, b...)
		dst = append(dst, '\n') // Dubbo's JSON outputs end each value with one
	default:
		dst = append(dst, msg...)
	}
	binary.BigEndian.PutUint32(dst[start+12:start+16], uint32(len(dst)-start-HeaderLen))
	return dst
}

// hessianChunk is the most UTF-16 units one hessian2 string chunk holds.
const hessianChunk = 0xffff

// AppendHessianString appends s encoded as a hessian2 string. Hessian
// counts a string's length in UTF-16 units and writes each unit as UTF-8,
// a character outside the BMP as its two surrogates, as Java does. A
// string of up to 31 units has a one-byte length, of up to 1023 a two-byte
// one; longer ones go in chunks of 65535 units, 'R' before each but the
// final one, 'S' before that.
func AppendHessianString(dst []byte, s string) []byte {
	units := utf16.Encode([]rune(s))
	for len(units) > hessianChunk {
		dst = append(dst, 'R', 0xff, 0xff)
		dst = appendJavaUTF8(dst, units[:hessianChunk])
		units = units[hessianChunk:]
	}
	switch n := len(units); {
	case n <= 31:
		dst = append(dst, byte(n))
	case n <= 1023:
		dst = append(dst, 0x30+byte(n>>8), byte(n))
	default:
		dst = append(dst, 'S', byte(n>>8), byte(n))
	}
	return appendJavaUTF8(dst, units)
}

// appendJavaUTF8 writes each UTF-16 unit as its own UTF-8 sequence.
func appendJavaUTF8(dst []byte, units []uint16) []byte {
	for _, u := range units {
		switch {
		case u < 0x80:
			dst = append(dst, byte(u))
		case u < 0x800:
			dst = append(dst, 0xc0|byte(u>>6), 0x80|byte(u&0x3f))
		default:
			// Surrogates too: utf8.AppendRune would replace them.
			dst = append(dst, 0xe0|byte(u>>12), 0x80|byte(u>>6&0x3f), 0x80|byte(u&0x3f))
		}
	}
	return dst
}

// DecodeHessianString decodes the hessian2 string at the start of b, as a
// Dubbo peer writes an error message, and returns it with the bytes that
// follow. Units that are lone surrogates decode as U+FFFD.
func DecodeHessianString(b []byte) (s string, rest []byte, err error) {
	var units []uint16
	for {
		if len(b) == 0 {
			return "", nil, fmt.Errorf("hessian2 string: %w", errShort)
		}
		var n int
		final := true
		switch tag := b[0]; {
		case tag <= 31:
			n, b = int(tag), b[1:]
		case tag >= 0x30 && tag <= 0x33:
			if len(b) < 2 {
				return "", nil, fmt.Errorf("hessian2 string length: %w", errShort)
			}
			n, b = int(tag-0x30)<<8|int(b[1]), b[2:]
		case tag == 'S' || tag == 'R':
			if len(b) < 3 {
				return "", nil, fmt.Errorf("hessian2 string length: %w", errShort)
			}
			n, b, final = int(b[1])<<8|int(b[2]), b[3:], tag == 'S'
		default:
			return "", nil, fmt.Errorf("hessian2: tag %#02x is not a string", tag)
		}
		for range n {
			u, k, err := javaUnit(b)
			if err != nil {
				return "", nil, err
			}
			units, b = append(units, u), b[k:]
		}
		if final {
			return string(utf16.Decode(units)), b, nil
		}
	}
}

// javaUnit decodes one UTF-16 unit written as UTF-8 by appendJavaUTF8.
func javaUnit(b []byte) (uint16, int, error) {
	switch {
	case len(b) >= 1 && b[0] < 0x80:
		return uint16(b[0]), 1, nil
	case len(b) >= 2 && b[0]&0xe0 == 0xc0:
		return uint16(b[0]&0x1f)<<6 | uint16(b[1]&0x3f), 2, nil
	case len(b) >= 3 && b[0]&0xf0 == 0xe0:
		return uint16(b[0]&0x0f)<<12 | uint16(b[1]&0x3f)<<6 | uint16(b[2]&0x3f), 3, nil
	}
	return 0, 0, fmt.Errorf("hessian2 string: bad or short UTF-8: %w", errShort)
}
