// Package formattest is a toy body format and codec for tests: serialization id 30, laid out unlike dabb's bodies.
//
// A body is a kind byte, then fields; a string is a 4-byte big-endian
// length and its bytes, and the attachments a 4-byte count and that many
// key and value strings:
//
//	request:            'Q' service method payload attachments
//	response, status 20: 'V' payload attachments
//	response, status 70: 'E' text attachments, with status 20 in the header
//	other responses:     'S' text attachments
//
// So the payload is not at the end, and a handler's error (70) travels
// as an OK status with an exception, as a Dubbo response carries one.
// Nothing may follow the last field.
package formattest

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"sync"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/protocol"
)

// ID is the toy's serialization id, which no codec of dabb's or Dubbo's
// uses.
const ID byte = 30

// Kinds: the first byte of a body.
const (
	KindRequest   = 'Q'
	KindValue     = 'V'
	KindException = 'E'
	KindStatus    = 'S'
)

// Format is the toy body format.
type Format struct{}

var _ protocol.BodyFormat = Format{}

// ID returns 30.
func (Format) ID() byte { return ID }

// Name returns "toy".
func (Format) Name() string { return "toy" }

// AppendBody appends m's body in the toy layout.
func (Format) AppendBody(h *protocol.Header, dst []byte, m *protocol.Message) []byte {
	switch s := h.Status(); {
	case h.Flags().IsRequest():
		dst = append(dst, KindRequest)
		dst = appendString(dst, m.Service)
		dst = appendString(dst, m.Method)
	case s == protocol.StatusOK:
		dst = append(dst, KindValue)
	case s == protocol.StatusServiceError:
		h.SetStatus(protocol.StatusOK)
		dst = append(dst, KindException)
	default:
		dst = append(dst, KindStatus)
	}
	dst = appendString(dst, string(m.Payload))
	n := 0
	for range m.WireAttachments() {
		n++
	}
	dst = binary.BigEndian.AppendUint32(dst, uint32(n))
	for k, v := range m.WireAttachments() {
		dst = appendString(dst, k)
		dst = appendString(dst, v)
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(s)))
	return append(dst, s...)
}

// Errors of DecodeBody.
var (
	ErrShort = errors.New("toy: truncated field")
	ErrKind  = errors.New("toy: wrong kind")
)

// DecodeBody fills m from a toy body.
func (Format) DecodeBody(m *protocol.Message, body []byte) error {
	if len(body) == 0 {
		return fmt.Errorf("%w: empty body", ErrShort)
	}
	kind, b := body[0], body[1:]
	req := m.Header.Flags().IsRequest()
	ok := m.Header.Status() == protocol.StatusOK
	switch {
	case kind == KindRequest && req:
		var svc, method []byte
		var err error
		if svc, b, err = field(b); err != nil {
			return err
		}
		if method, b, err = field(b); err != nil {
			return err
		}
		m.Service, m.Method = string(svc), string(method)
	case kind == KindValue && !req && ok, kind == KindStatus && !req && !ok:
	case kind == KindException && !req && ok:
		m.Header.SetStatus(protocol.StatusServiceError)
	default:
		return fmt.Errorf("%w: %q in a frame with flags %#02x, status %d", ErrKind, kind, m.Header.Flags(), m.Header.Status())
	}
	payload, b, err := field(b)
	if err != nil {
		return err
	}
	m.Payload = payload
	if len(b) < 4 {
		return fmt.Errorf("%w: attachment count", ErrShort)
	}
	n := binary.BigEndian.Uint32(b)
	b = b[4:]
	if n > protocol.MaxAttachments || uint64(n) > uint64(len(b)/8) {
		return fmt.Errorf("toy: %d attachments in %d bytes", n, len(b))
	}
	for range n {
		var k, v []byte
		if k, b, err = field(b); err != nil {
			return err
		}
		if v, b, err = field(b); err != nil {
			return err
		}
		if m.Attachments == nil {
			m.Attachments = make(map[string]string, n)
		}
		m.Attachments[string(k)] = string(v)
	}
	if len(b) != 0 {
		return fmt.Errorf("toy: %d bytes after the last field", len(b))
	}
	return nil
}

func field(b []byte) (f, rest []byte, err error) {
	if len(b) < 4 {
		return nil, nil, fmt.Errorf("%w: length", ErrShort)
	}
	n := binary.BigEndian.Uint32(b)
	if uint64(n) > uint64(len(b)-4) {
		return nil, nil, fmt.Errorf("%w: %d bytes claimed, %d left", ErrShort, n, len(b)-4)
	}
	return b[4 : 4+n], b[4+n:], nil
}

// Codec is the toy's codec: JSON under serialization id 30, name "toy".
type Codec struct{}

// ID returns 30.
func (Codec) ID() byte { return ID }

// Name returns "toy".
func (Codec) Name() string { return "toy" }

// Marshal appends v's JSON encoding to dst.
func (Codec) Marshal(dst []byte, v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append(dst, b...), err
}

// Unmarshal decodes JSON data into v.
func (Codec) Unmarshal(data []byte, v any) error { return json.Unmarshal(data, v) }

var once sync.Once

// Register registers the toy's body format and codec, once per process.
func Register() {
	once.Do(func() {
		protocol.RegisterBodyFormat(Format{})
		codec.Register(Codec{})
	})
}
