// Message: a frame's decoded body, and reading and appending whole frames.

package protocol

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/dabbrpc/dabb/internal/bufpool"
)

// Well-known attachment keys. The timeout travels as an attachment on the
// wire but is decoded into [Message.Timeout], never into the map.
const (
	// AttachTimeout is the remaining deadline budget in whole
	// milliseconds, rounded up, decimal ASCII (Dubbo's "timeout"
	// attachment); "0" means the budget is spent.
	AttachTimeout = "timeout"
	// AttachIdempotencyKey is the key shared by every attempt of one
	// call, so a server can deduplicate retries. It is decoded into
	// [Message.IdempotencyKey], never into the map.
	AttachIdempotencyKey = "idempotency-key"
	// AttachAuthorization carries the caller's credentials, as
	// "Bearer <token>" when proxy.BearerToken sends them. It is an
	// ordinary attachment, decoded into the map.
	AttachAuthorization = "authorization"
)

// Message is one frame: a header and, for requests and responses, the
// decoded body fields.
//
// A request body is
//
//	uvarint len | service | uvarint len | method |
//	uvarint count | count × (uvarint len | key | uvarint len | value) |
//	payload (the rest of the body, the codec's bytes, untouched)
//
// A response uses the same layout with empty service and method; a non-OK
// response's payload is its error message as UTF-8 text. Event frames have
// Dubbo's bodies, kept whole in Payload.
type Message struct {
	Header  Header
	Service string
	Method  string
	// Timeout is the remaining deadline budget: > 0 a budget, 0 none,
	// < 0 already spent. It travels as the "timeout" attachment.
	Timeout time.Duration
	// IdempotencyKey travels as the "idempotency-key" attachment. A read
	// puts it here rather than in Attachments, so a keyed request decodes
	// without a map. When writing, a non-empty IdempotencyKey is sent and
	// an "idempotency-key" entry of Attachments is not; an empty one lets
	// the map's entry, if any, travel.
	IdempotencyKey string
	// Attachments are string key/value pairs (trace ids, auth, ...). Nil
	// when the frame has none besides the timeout and idempotency key.
	Attachments map[string]string
	// Payload is the codec's bytes (or, in a non-OK response, the error
	// text). After a read it aliases the message's own buffer and stays
	// valid until the next read into the same Message.
	Payload []byte

	buf []byte // body storage reused across reads
}

// Reset clears m for reuse, keeping its read buffer.
func (m *Message) Reset() {
	buf := m.buf
	*m = Message{buf: buf[:0]}
}

// Err returns nil for an OK response or a request, else the response's
// status as a remote [*Error]. Its Msg is the payload text. Its Code and
// Details are read from the attachments [Message.SetError] writes.
func (m *Message) Err() error {
	f := m.Header.Flags()
	s := m.Header.Status()
	if f.IsRequest() || f.IsEvent() || s == StatusOK {
		return nil
	}
	e := &Error{Status: s, Msg: string(m.Payload), Remote: true}
	readErrorAttachments(e, m.Attachments)
	return e
}

// Errors returned by the readers. ErrBadMagic, ErrBodyTooLarge and a read
// error leave the stream at an unknown position: close the connection.
// ErrMalformed is reported after the whole frame was consumed, so the
// stream is still in step and the header (m.Header) names the request to
// answer with StatusBadRequest.
//
// ErrTooManyAttachments is what [CheckAttachments] reports for a message
// over [MaxAttachments]; a read of such a frame fails with an error that
// matches both it and ErrMalformed.
var (
	ErrBadMagic           = errors.New("protocol: bad magic")
	ErrBodyTooLarge       = errors.New("protocol: body too large")
	ErrMalformed          = errors.New("protocol: malformed body")
	ErrTooManyAttachments = errors.New("protocol: too many attachments")
)

// MaxAttachments is the most attachments one request or response may
// carry on the wire, the timeout and idempotency key included. A frame
// whose count says more is malformed and refused before any is decoded.
// [CheckAttachments] lets a sender find out first. The body limit bounds
// their bytes. docs/protocol.md says why the count needs a bound of its own.
const MaxAttachments = 1024

// CheckAttachments returns an error wrapping ErrTooManyAttachments when m
// would carry more than MaxAttachments attachments on the wire. The
// timeout and the idempotency key count when set. A receiver refuses such
// a frame as malformed, so a sender checks before writing. AppendMessage
// and AppendFrameHead do not check: they encode what they are given.
func CheckAttachments(m *Message) error {
	if m.Header.Flags().IsEvent() {
		return nil
	}
	if n := wireAttachments(m); n > MaxAttachments {
		return fmt.Errorf("%w: %d, limit %d", ErrTooManyAttachments, n, MaxAttachments)
	}
	return nil
}

// wireAttachments is the attachment count appendHead writes for m.
func wireAttachments(m *Message) int {
	n := len(m.Attachments)
	if _, dup := m.Attachments[AttachTimeout]; dup {
		n--
	}
	if m.Timeout != 0 {
		n++
	}
	if m.IdempotencyKey != "" {
		n++
		if _, dup := m.Attachments[AttachIdempotencyKey]; dup {
			n--
		}
	}
	return n
}

// AppendMessage appends m encoded as a frame to dst and returns the result.
// The magic and body length are filled in; the rest of m.Header is used as
// set. Event frames are written with m.Payload as their whole body. A
// request or response is laid out by the body format of its serialization
// id ([RegisterBodyFormat]), which may set the status byte, or in dabb's
// layout when the id has none. It does not check [MaxAttachments]: see
// [CheckAttachments].
func AppendMessage(dst []byte, m *Message) []byte {
	if f := formatOf(&m.Header); f != nil {
		return appendFormatted(dst, m, f)
	}
	start := len(dst)
	dst = appendHead(dst, m)
	dst = append(dst, m.Payload...)
	binary.BigEndian.PutUint32(dst[start+12:start+16], uint32(len(dst)-start-HeaderLen))
	return dst
}

// AppendFrameHead appends all of m's frame except its payload: the header,
// whose body length counts the payload, and for a request or response the
// fields that precede the payload. The result followed by m.Payload is
// exactly what AppendMessage writes, so a large payload can be sent from
// its own buffer (writev) instead of being copied. It panics unless
// [PayloadAtEnd] reports true for m.
func AppendFrameHead(dst []byte, m *Message) []byte {
	if f := formatOf(&m.Header); f != nil {
		panic("protocol: AppendFrameHead of a frame in body format " + f.Name())
	}
	start := len(dst)
	dst = appendHead(dst, m)
	binary.BigEndian.PutUint32(dst[start+12:start+16], uint32(len(dst)-start-HeaderLen+len(m.Payload)))
	return dst
}

// BodyLen returns the length of the body AppendMessage writes for m (what
// its header's bytes 12-15 will say). It encodes nothing for dabb's layout
// and events; a body format's body is encoded into a scratch buffer.
func BodyLen(m *Message) int {
	if f := formatOf(&m.Header); f != nil {
		return formattedLen(m, f)
	}
	n := len(m.Payload)
	if m.Header.Flags().IsEvent() {
		return n
	}
	str := func(l int) int { return uvarintLen(uint64(l)) + l }
	n += str(len(m.Service)) + str(len(m.Method))
	if m.Timeout != 0 {
		var num [20]byte
		n += str(len(AttachTimeout)) + str(len(strconv.AppendInt(num[:0], timeoutMillis(m.Timeout), 10)))
	}
	if m.IdempotencyKey != "" {
		n += str(len(AttachIdempotencyKey)) + str(len(m.IdempotencyKey))
	}
	n += uvarintLen(uint64(wireAttachments(m)))
	for k, v := range m.Attachments {
		if k == AttachTimeout || (k == AttachIdempotencyKey && m.IdempotencyKey != "") {
			continue
		}
		n += str(len(k)) + str(len(v))
	}
	return n
}

func uvarintLen(x uint64) int {
	n := 1
	for x >= 0x80 {
		x >>= 7
		n++
	}
	return n
}

// appendHead appends the header (body length not yet set) and the fields
// before the payload.
func appendHead(dst []byte, m *Message) []byte {
	h := m.Header
	h.SetMagic()
	dst = append(dst, h[:]...)
	if m.Header.Flags().IsEvent() {
		return dst
	}
	dst = appendString(dst, m.Service)
	dst = appendString(dst, m.Method)
	dst = binary.AppendUvarint(dst, uint64(wireAttachments(m)))
	if m.Timeout != 0 {
		dst = appendString(dst, AttachTimeout)
		var num [20]byte
		dst = appendBytes(dst, strconv.AppendInt(num[:0], timeoutMillis(m.Timeout), 10))
	}
	if m.IdempotencyKey != "" {
		dst = appendString(dst, AttachIdempotencyKey)
		dst = appendString(dst, m.IdempotencyKey)
	}
	for k, v := range m.Attachments {
		if k == AttachTimeout || (k == AttachIdempotencyKey && m.IdempotencyKey != "") {
			continue
		}
		dst = appendString(dst, k)
		dst = appendString(dst, v)
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst []byte, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// ReadMessage reads one frame from r into m, refusing a body longer than
// maxBody (0 means DefaultMaxBody) before allocating anything for it.
// See [Reader] for a reader that also interns names.
func ReadMessage(r *bufio.Reader, m *Message, maxBody uint32) error {
	return readMessage(r, m, maxBody, nil, nil, nil)
}

// Reader reads frames from one connection. It interns service and method
// names, so steady traffic decodes them without allocating.
type Reader struct {
	br      *bufio.Reader
	maxBody uint32
	names   map[string]string
	// recent holds the last names interned; it is checked before the map.
	recent [4]string
	next   int // the slot of recent to fill next
	budget Budget
	known  func(serialization byte) bool
}

// maxInterned bounds the entries of the intern table, and maxInternedLen
// the length of a name it keeps. A peer sending endless or long names
// must not grow a connection's table without limit.
const (
	maxInterned    = 4096
	maxInternedLen = 256
)

// NewReader returns a Reader over br with a body limit (0 means
// DefaultMaxBody).
func NewReader(br *bufio.Reader, maxBody uint32) *Reader {
	return &Reader{br: br, maxBody: maxBody, names: make(map[string]string)}
}

// Read reads one frame into m; its errors are those of ReadMessage.
func (r *Reader) Read(m *Message) error {
	return readMessage(r.br, m, r.maxBody, r.intern, r.budget, r.known)
}

// SetSerializations makes r refuse a request or response whose
// serialization id known rejects. Read then discards its body unread and
// returns an error wrapping ErrUnknownSerialization that names the id;
// the header (m.Header) names the frame to answer. Events are not asked
// about: Dubbo writes them in hessian2. Nil (the default) accepts every id.
func (r *Reader) SetSerializations(known func(serialization byte) bool) { r.known = known }

func (r *Reader) intern(b []byte) string {
	if len(b) > maxInternedLen {
		return string(b)
	}
	// A connection mostly repeats a few (service, method) pairs: comparing
	// a few short strings is cheaper than hashing the name for the map.
	for _, s := range r.recent {
		if s == string(b) {
			return s
		}
	}
	s, ok := r.names[string(b)]
	if !ok {
		s = string(b)
		if len(r.names) < maxInterned {
			r.names[s] = s
		}
	}
	r.recent[r.next] = s
	r.next = (r.next + 1) % len(r.recent)
	return s
}

// A Budget bounds the body bytes that the readers sharing it receive at
// once: a server's memory for bodies on their way in.
type Budget interface {
	// Acquire takes n bytes of the budget, waiting until they are free.
	// A read whose Acquire fails ends with its error.
	Acquire(n int) error
	// Release gives back n bytes that Acquire took.
	Release(n int)
}

// SetBudget makes r take each body over BudgetMin bytes from b, whole,
// before reading any of it, and give it back once the body is read.
// Smaller bodies do not wait. Nil (the default) means no budget.
func (r *Reader) SetBudget(b Budget) { r.budget = b }

// BudgetMin is the body size from which a [Reader] with a [Budget] takes
// the body's bytes from it: 64 KiB.
const BudgetMin = 64 << 10

// minGrow is the least room a body buffer grows by. Then it grows to
// twice what has arrived, or to what the reader holds, whichever is more,
// until readBody takes the body's whole length (wholeAt). So a peer that
// claims a large length and sends little costs little: at most wholeAt
// times what it sent, or the budget that already counts the body.
const minGrow = 8 << 10

func readMessage(r *bufio.Reader, m *Message, maxBody uint32, intern func([]byte) string, budget Budget, known func(byte) bool) error {
	if maxBody == 0 {
		maxBody = DefaultMaxBody
	}
	buf := m.buf[:0]
	*m = Message{}
	if _, err := io.ReadFull(r, m.Header[:]); err != nil {
		m.buf = buf
		return err
	}
	if got := m.Header.Magic(); got != Magic {
		m.buf = buf
		return fmt.Errorf("%w: %#04x", ErrBadMagic, got)
	}
	n := m.Header.BodyLen()
	if n > maxBody {
		m.buf = buf
		return fmt.Errorf("%w: %d bytes, limit %d", ErrBodyTooLarge, n, maxBody)
	}
	if f := m.Header.Flags(); known != nil && !f.IsEvent() && !known(f.Serialization()) {
		// Another protocol's body (a Dubbo peer's hessian2) costs no
		// buffer: it is skipped, not parsed as dabb's layout.
		m.buf = buf
		if _, err := r.Discard(int(n)); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		id := f.Serialization()
		return fmt.Errorf("%w: %s (id %d), frame id %d", ErrUnknownSerialization, SerializationName(id), id, m.Header.ID())
	}
	var err error
	buf, err = readBody(r, buf, int(n), budget)
	m.buf = buf
	if err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return err
	}
	if m.Header.Flags().IsEvent() {
		m.Payload = buf
		return nil
	}
	if f := formatOf(&m.Header); f != nil {
		err = decodeFormatted(m, buf, f)
	} else {
		err = m.decodeBody(buf, intern)
	}
	if err != nil {
		return fmt.Errorf("%w: request id %d: %w", ErrMalformed, m.Header.ID(), err)
	}
	return nil
}

// maxKept is the largest buffer a Message keeps between reads when the
// next body is much smaller, and the largest Recycle keeps. One large
// frame must not pin megabytes to a connection for its lifetime.
const maxKept = 1 << 20

// Recycle resets m like Reset, and hands a read buffer over bufpool.MaxKept
// (256 KiB) back to the shared buffer pool instead of keeping it. Nothing may use m's
// Payload, or anything that aliases it, afterwards.
func (m *Message) Recycle() {
	buf := m.buf
	if cap(buf) > bufpool.MaxKept {
		bufpool.Put(buf)
		buf = nil
	}
	*m = Message{buf: buf[:0]}
}

// readBody reads an n-byte body into buf, or into a larger buffer. It
// allocates only for bytes that have arrived: a buffer grows once the
// bytes to fill it are in r. The buffer is the body's whole length from
// the first bytes on when budget counted it, and otherwise once an eighth
// of it has arrived; before that it grows by doubling.
func readBody(r *bufio.Reader, buf []byte, n int, budget Budget) ([]byte, error) {
	if cap(buf) > maxKept && n < cap(buf)/4 {
		bufpool.Put(buf)
		buf = nil
	}
	if cap(buf) >= n {
		buf = buf[:n]
		_, err := io.ReadFull(r, buf)
		return buf, err
	}
	counted := budget != nil && n > BudgetMin
	if counted {
		if err := budget.Acquire(n); err != nil {
			return buf[:0], err
		}
		defer budget.Release(n)
	}
	have := 0
	for {
		if have == cap(buf) {
			// Wait for the next bytes before making room for them.
			if _, err := r.Peek(1); err != nil {
				return buf[:have], err
			}
			arrived := have + r.Buffered()
			size := min(n, max(2*have, arrived, minGrow))
			if counted || n <= wholeAt*arrived {
				// Each step of the doubling copies what came before: a
				// 1 MiB body copied once more in all. The budget holds
				// the whole length anyway.
				size = n
			}
			next := bufpool.Get(size)
			copy(next, buf[:have])
			if cap(buf) >= bufpool.Min {
				bufpool.Put(buf) // a call allocates: only a buffer worth keeping goes
			}
			buf = next
		}
		k, err := io.ReadFull(r, buf[have:min(n, cap(buf))])
		have += k
		if err != nil {
			return buf[:have], err
		}
		if have == n {
			return buf[:n], nil
		}
	}
}

// wholeAt is the share of a body, as 1/wholeAt, that must have arrived
// before a body no budget counts gets a buffer of its whole length.
const wholeAt = 8

var errShort = errors.New("truncated field")

func (m *Message) decodeBody(b []byte, intern func([]byte) string) error {
	var field []byte
	var err error
	if field, b, err = readField(b); err != nil {
		return fmt.Errorf("service: %w", err)
	}
	m.Service = makeString(field, intern)
	if field, b, err = readField(b); err != nil {
		return fmt.Errorf("method: %w", err)
	}
	m.Method = makeString(field, intern)
	count, k := binary.Uvarint(b)
	if k <= 0 {
		return fmt.Errorf("attachment count: %w", errShort)
	}
	b = b[k:]
	if count > MaxAttachments {
		return fmt.Errorf("%w: %d, limit %d", ErrTooManyAttachments, count, MaxAttachments)
	}
	if count > uint64(len(b)/2) { // each pair takes at least two bytes
		return fmt.Errorf("attachment count %d exceeds the body", count)
	}
	for i := uint64(0); i < count; i++ {
		var key, val []byte
		if key, b, err = readField(b); err != nil {
			return fmt.Errorf("attachment key: %w", err)
		}
		if val, b, err = readField(b); err != nil {
			return fmt.Errorf("attachment value: %w", err)
		}
		if string(key) == AttachTimeout {
			ms, perr := parseMillis(val)
			if perr != nil {
				return perr
			}
			m.Timeout = ms
			continue
		}
		if string(key) == AttachIdempotencyKey {
			m.IdempotencyKey = string(val)
			continue
		}
		if m.Attachments == nil {
			// count is at most MaxAttachments, so reserving for all
			// of them is bounded even when the peer repeats one pair.
			m.Attachments = make(map[string]string, count)
		}
		m.Attachments[makeString(key, intern)] = string(val)
	}
	m.Payload = b
	return nil
}

func makeString(b []byte, intern func([]byte) string) string {
	if len(b) == 0 {
		return ""
	}
	if intern != nil {
		return intern(b)
	}
	return string(b)
}

func readField(b []byte) (field, rest []byte, err error) {
	n, k := binary.Uvarint(b)
	if k <= 0 {
		return nil, nil, errShort
	}
	b = b[k:]
	if n > uint64(len(b)) {
		return nil, nil, errShort
	}
	return b[:n], b[n:], nil
}
