// Body formats: the layout of request and response bodies, chosen by the header's serialization id.

package protocol

import (
	"fmt"
	"iter"
	"strconv"
	"sync"
	"sync/atomic"
)

// A BodyFormat lays out the bodies of requests and responses in one
// serialization id, in place of dabb's layout (service, method,
// attachments, payload). It is the core's one extension point for another
// protocol's bodies: a Dubbo peer's hessian2 (id 2), say. Events are not
// bodies: they keep Dubbo's event bodies whatever formats are registered.
//
// A format maps its body to a [Message] and back:
//
//   - Service and Method name the call, as the server's table knows them.
//   - Attachments hold the call's string pairs, and the format's own
//     strings under keys it documents (a Dubbo body's service version,
//     say). A "timeout" pair becomes Timeout and an "idempotency-key"
//     pair IdempotencyKey after DecodeBody, by dabb's rules.
//   - Payload holds the bytes the codec registered for the same id
//     decodes, the format's arguments or result. In a response whose
//     status is not OK it is the error message as UTF-8 text.
//
// Implementations must be safe for concurrent use.
type BodyFormat interface {
	// ID is the serialization id whose bodies the format lays out, 0-31.
	ID() byte
	// Name names the format in errors and logs, e.g. "dubbo-hessian2".
	Name() string
	// DecodeBody fills m from body, the whole body of the request or
	// response frame whose header m.Header holds. m's other fields are
	// zero. body is m's own read buffer: m.Payload may be a slice of it,
	// valid until the next read into m, and the format may overwrite its
	// bytes. DecodeBody may set the header's status byte (a result that
	// carries an exception read as StatusServiceError, say), and nothing
	// else of the header. It refuses more than MaxAttachments attachments
	// before decoding them. Its error makes the frame malformed.
	DecodeBody(m *Message, body []byte) error
	// AppendBody appends m's body to dst and returns the result. h is the
	// frame's header, written before the body once AppendBody returns.
	// The format may set its status byte, and nothing else. Timeout and
	// IdempotencyKey travel as attachments: [Message.WireAttachments]
	// yields every pair to write.
	AppendBody(h *Header, dst []byte, m *Message) []byte
}

var (
	formatsMu sync.Mutex // serialises RegisterBodyFormat
	formats   atomic.Pointer[[32]BodyFormat]
)

// RegisterBodyFormat makes f the body format of its serialization id.
// It is meant to be called from init, beside the codec of the same id.
// It panics on a nil format, an id over 31, or an id that already has a
// format. An id without a format has dabb's layout.
func RegisterBodyFormat(f BodyFormat) {
	if f == nil {
		panic("protocol: RegisterBodyFormat of nil format")
	}
	id := f.ID()
	if id > 31 {
		panic(fmt.Sprintf("protocol: id %d of body format %q does not fit in five bits", id, f.Name()))
	}
	formatsMu.Lock()
	defer formatsMu.Unlock()
	var next [32]BodyFormat
	if old := formats.Load(); old != nil {
		if o := old[id]; o != nil {
			panic(fmt.Sprintf("protocol: body format for id %d registered twice (%q and %q)", id, o.Name(), f.Name()))
		}
		next = *old
	}
	next[id] = f
	formats.Store(&next)
}

// LookupBodyFormat returns the body format registered for a serialization
// id, or nil when the id has dabb's layout.
func LookupBodyFormat(id byte) BodyFormat {
	if t := formats.Load(); t != nil && id < 32 {
		return t[id]
	}
	return nil
}

// formatOf returns the body format of m's frame, or nil for dabb's layout
// and for events.
func formatOf(h *Header) BodyFormat {
	t := formats.Load()
	if t == nil {
		return nil
	}
	f := h.Flags()
	if f.IsEvent() {
		return nil
	}
	return t[f.Serialization()]
}

// PayloadAtEnd reports whether m's frame ends with m.Payload, untouched:
// true for events and for dabb's layout, false for an id with a body
// format. Only then is AppendFrameHead followed by m.Payload the frame.
func PayloadAtEnd(m *Message) bool { return formatOf(&m.Header) == nil }

// WireAttachments yields the attachments m carries on the wire, as dabb's
// layout writes them: Timeout as "timeout" (whole milliseconds, rounded
// up; "0" when spent; none when zero), IdempotencyKey as
// "idempotency-key" when set, then the map's other entries in any order.
// A body format writes these pairs.
func (m *Message) WireAttachments() iter.Seq2[string, string] {
	return func(yield func(k, v string) bool) {
		if m.Timeout != 0 && !yield(AttachTimeout, strconv.FormatInt(timeoutMillis(m.Timeout), 10)) {
			return
		}
		if m.IdempotencyKey != "" && !yield(AttachIdempotencyKey, m.IdempotencyKey) {
			return
		}
		for k, v := range m.Attachments {
			if k == AttachTimeout || (k == AttachIdempotencyKey && m.IdempotencyKey != "") {
				continue
			}
			if !yield(k, v) {
				return
			}
		}
	}
}

// appendFormatted appends m as a frame whose body f lays out.
func appendFormatted(dst []byte, m *Message, f BodyFormat) []byte {
	start := len(dst)
	h := m.Header
	dst = append(dst, h[:]...) // room for the header, written below
	dst = f.AppendBody(&h, dst, m)
	h.SetMagic()
	h.SetBodyLen(uint32(len(dst) - start - HeaderLen))
	copy(dst[start:], h[:])
	return dst
}

// scratch holds buffers for BodyLen of formatted frames.
var scratch = sync.Pool{New: func() any { return new([]byte) }}

// formattedLen returns the body length of m laid out by f.
func formattedLen(m *Message, f BodyFormat) int {
	bp := scratch.Get().(*[]byte)
	b := appendFormatted((*bp)[:0], m, f)
	n := len(b) - HeaderLen
	if cap(b) <= maxKept {
		*bp = b[:0]
		scratch.Put(bp)
	}
	return n
}

// decodeFormatted fills m from body with f. It turns a panic of the
// format into an error, moves the timeout and idempotency key out of the
// attachments and checks MaxAttachments.
func decodeFormatted(m *Message, body []byte, f BodyFormat) (err error) {
	h := m.Header
	defer func() {
		if v := recover(); v != nil {
			// A decoder fed a hostile body must not take the process down
			// with it: the frame is answered as malformed.
			err = fmt.Errorf("%s body: decoder panicked: %v", f.Name(), v)
		}
		s := m.Header.Status()
		m.Header = h
		m.Header.SetStatus(s)
	}()
	if err := f.DecodeBody(m, body); err != nil {
		return fmt.Errorf("%s body: %w", f.Name(), err)
	}
	if len(m.Attachments) == 0 {
		m.Attachments = nil
		return nil
	}
	if v, ok := m.Attachments[AttachTimeout]; ok {
		d, err := parseMillis(v)
		if err != nil {
			return fmt.Errorf("%s body: %w", f.Name(), err)
		}
		m.Timeout = d
		delete(m.Attachments, AttachTimeout)
	}
	if v, ok := m.Attachments[AttachIdempotencyKey]; ok {
		m.IdempotencyKey = v
		delete(m.Attachments, AttachIdempotencyKey)
	}
	if n := wireAttachments(m); n > MaxAttachments {
		return fmt.Errorf("%w: %d, limit %d", ErrTooManyAttachments, n, MaxAttachments)
	}
	if len(m.Attachments) == 0 {
		m.Attachments = nil
	}
	return nil
}
