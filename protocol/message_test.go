package protocol_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"reflect"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/dabbrpc/dabb/protocol"
)

func TestRoundTrip(t *testing.T) {
	big := make([]byte, 200<<10) // over the 64 KiB chunk: the chunked read path
	rand.NewChaCha8([32]byte{1}).Read(big)
	exact := bytes.Repeat([]byte{'e'}, 64<<10)

	tests := []struct {
		name string
		in   protocol.Message
		want protocol.Message // zero: same as in
	}{
		{name: "empty fields", in: protocol.Message{Header: request(1)}},
		{name: "one-way request", in: func() protocol.Message {
			var h protocol.Header
			h.Init(protocol.MakeFlags(protocol.FlagRequest, 16), 0, 2)
			return protocol.Message{Header: h, Service: "s", Method: "m", Payload: []byte(`{}`)}
		}()},
		{name: "typical request", in: protocol.Message{
			Header: request(3), Service: "inventory.Inventory", Method: "Deduct",
			Timeout: 1500 * time.Millisecond, Payload: []byte{0x0a, 0x06, 's', 'k', 'u', '-', '4', '2'},
		}},
		{name: "attachments", in: protocol.Message{
			Header: request(4), Service: "svc", Method: "m",
			Attachments: map[string]string{
				protocol.AttachIdempotencyKey: "7f3a", "traceparent": "00-abc-def-01",
				"empty": "", "": "empty key", "ключ": "значение",
			},
			Payload: []byte("p"),
		}},
		{name: "empty attachment map", in: protocol.Message{Header: request(5), Attachments: map[string]string{}}},
		{name: "timeout 1ms", in: protocol.Message{Header: request(6), Timeout: time.Millisecond}},
		{
			name: "timeout rounded up to ms", in: protocol.Message{Header: request(7), Timeout: 2*time.Millisecond + time.Nanosecond},
			want: protocol.Message{Header: request(7), Timeout: 3 * time.Millisecond},
		},
		{name: "timeout largest on the wire", in: protocol.Message{Header: request(8), Timeout: 999_999_999_999 * time.Millisecond}},
		{name: "timeout spent", in: protocol.Message{Header: request(9), Timeout: -1}},
		{
			name: "timeout far spent", in: protocol.Message{Header: request(10), Timeout: -5 * time.Second},
			want: protocol.Message{Header: request(10), Timeout: -1},
		},
		{
			name: "timeout under 1ms is 1ms", in: protocol.Message{Header: request(11), Timeout: 500 * time.Microsecond},
			want: protocol.Message{Header: request(11), Timeout: time.Millisecond},
		},
		{
			name: "timeout key in map without Timeout is dropped",
			in:   protocol.Message{Header: request(12), Attachments: map[string]string{"timeout": "5", "k": "v"}},
			want: protocol.Message{Header: request(12), Attachments: map[string]string{"k": "v"}},
		},
		{
			name: "Timeout wins over the map's timeout key",
			in:   protocol.Message{Header: request(13), Timeout: time.Second, Attachments: map[string]string{"timeout": "5"}},
			want: protocol.Message{Header: request(13), Timeout: time.Second},
		},
		{name: "ok response", in: protocol.Message{Header: response(14, protocol.StatusOK), Payload: []byte{0x08, 0x62}}},
		{name: "error response", in: protocol.Message{Header: response(15, protocol.StatusServiceError), Payload: []byte("out of stock: sku-42")}},
		{name: "payload exactly 64 KiB", in: protocol.Message{Header: request(16), Service: "s", Method: "m", Payload: exact}},
		{name: "long names and key", in: protocol.Message{Header: request(18), Service: strings.Repeat("s", 200), Method: strings.Repeat("m", 20000),
			IdempotencyKey: strings.Repeat("k", 300), Attachments: map[string]string{protocol.AttachIdempotencyKey: "dup", "v": strings.Repeat("v", 129)}},
			want: protocol.Message{Header: request(18), Service: strings.Repeat("s", 200), Method: strings.Repeat("m", 20000),
				IdempotencyKey: strings.Repeat("k", 300), Attachments: map[string]string{"v": strings.Repeat("v", 129)}}},
		{name: "payload 200 KiB", in: protocol.Message{Header: request(17), Service: "s", Method: "m", Timeout: time.Second, Payload: big}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := &tt.want
			if want.Header == (protocol.Header{}) {
				want = &tt.in
			}
			frame := encode(&tt.in)
			var h protocol.Header
			copy(h[:], frame)
			if h.Magic() != protocol.Magic {
				t.Errorf("magic %#x", h.Magic())
			}
			if got := int(h.BodyLen()); got != len(frame)-protocol.HeaderLen {
				t.Errorf("body length %d in the header, frame body is %d bytes", got, len(frame)-protocol.HeaderLen)
			}
			if got := protocol.BodyLen(&tt.in); got != len(frame)-protocol.HeaderLen {
				t.Errorf("BodyLen = %d, the encoded body is %d bytes", got, len(frame)-protocol.HeaderLen)
			}
			for name, r := range map[string]*bufio.Reader{
				"whole":        reader(frame),
				"7-byte reads": bufio.NewReaderSize(&chunkReader{bytes.NewReader(frame), 7}, 16),
			} {
				var got protocol.Message
				if err := protocol.ReadMessage(r, &got, 0); err != nil {
					t.Fatalf("%s: ReadMessage: %v", name, err)
				}
				if d := diffMessage(&got, want); d != "" {
					t.Errorf("%s: %s", name, d)
				}
				if got.Header.BodyLen() != h.BodyLen() {
					t.Errorf("%s: read body length %d, want %d", name, got.Header.BodyLen(), h.BodyLen())
				}
				if _, err := r.ReadByte(); err != io.EOF {
					t.Errorf("%s: bytes left after the frame (err %v)", name, err)
				}
			}
		})
	}
}

func TestAppendMessageAppends(t *testing.T) {
	m := protocol.Message{Header: request(1), Service: "s", Method: "m", Payload: []byte("x")}
	one := encode(&m)
	two := protocol.AppendMessage(append([]byte(nil), one...), &m)
	if !bytes.Equal(two[:len(one)], one) || !bytes.Equal(two[len(one):], one) {
		t.Fatalf("appending a second frame changed the first or wrote a different one:\n% x", two)
	}
	r := reader(two)
	for i := range 2 {
		var got protocol.Message
		mustRead(t, r, &got)
		if d := diffMessage(&got, &m); d != "" {
			t.Errorf("frame %d: %s", i, d)
		}
	}
}

// The magic is always written, even when the caller left it unset; the
// caller's header is not modified.
func TestAppendMessageSetsMagicAndLength(t *testing.T) {
	var m protocol.Message
	m.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest, 22))
	m.Header.SetBodyLen(12345)
	frame := encode(&m)
	want := []byte{0xda, 0xbb, 0x96, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0}
	if !bytes.Equal(frame, want) {
		t.Errorf("frame % x, want % x", frame, want)
	}
	if m.Header.Magic() != 0 || m.Header.BodyLen() != 12345 {
		t.Errorf("AppendMessage modified the caller's header: % x", m.Header[:])
	}
}

func TestTimeoutOnTheWire(t *testing.T) {
	tests := []struct {
		name    string
		timeout time.Duration
		want    string // the body's attachment section; "" for none
	}{
		{"none", 0, "\x00"},
		{"positive", 1500 * time.Millisecond, "\x01\x07timeout\x041500"},
		{"rounded up", 1500*time.Millisecond + time.Nanosecond, "\x01\x07timeout\x041501"},
		{"under 1ms", time.Nanosecond, "\x01\x07timeout\x011"},
		{"spent", -1, "\x01\x07timeout\x010"},
		{"far spent", -time.Hour, "\x01\x07timeout\x010"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := protocol.Message{Header: request(1), Timeout: tt.timeout}
			body := encode(&m)[protocol.HeaderLen:]
			// Empty service and method, then the attachments.
			if got := string(body[2:]); got != tt.want {
				t.Errorf("attachments %q, want %q", got, tt.want)
			}
		})
	}
}

func TestReadMessageBufferReuse(t *testing.T) {
	frames := []protocol.Message{
		{Header: request(1), Service: "a", Method: "big", Payload: bytes.Repeat([]byte{'B'}, 300<<10)},
		{Header: request(2), Service: "a", Method: "small", Payload: []byte("s"), Attachments: map[string]string{"k": "v"}},
		{Header: response(3, protocol.StatusOK)},
		{Header: request(4), Service: "b", Method: "mid", Payload: bytes.Repeat([]byte{'M'}, 70<<10)},
		{Header: request(5), Service: "a", Method: "big", Payload: bytes.Repeat([]byte{'C'}, 300<<10)},
	}
	var stream []byte
	for i := range frames {
		stream = protocol.AppendMessage(stream, &frames[i])
	}
	stream = protocol.AppendHeartbeat(stream, 6)
	r := reader(stream)
	var m protocol.Message
	for i := range frames {
		mustRead(t, r, &m)
		if d := diffMessage(&m, &frames[i]); d != "" {
			t.Errorf("frame %d: %s", i, d)
		}
	}
	mustRead(t, r, &m)
	if !m.IsHeartbeat() || m.Service != "" || m.Attachments != nil || m.Header.ID() != 6 {
		t.Errorf("heartbeat after reuse read as %+v", m)
	}
	if err := protocol.ReadMessage(r, &m, 0); err != io.EOF {
		t.Errorf("at the end of the stream: %v, want io.EOF", err)
	}
}

// After a read, Payload aliases the Message's own buffer: a second read
// into the same Message reuses it, a read into another Message does not.
func TestPayloadValidUntilNextRead(t *testing.T) {
	a := protocol.Message{Header: request(1), Service: "s", Method: "m", Payload: []byte("aaaa")}
	b := protocol.Message{Header: request(2), Service: "s", Method: "m", Payload: []byte("bbbb")}
	stream := protocol.AppendMessage(encode(&a), &b)
	stream = protocol.AppendMessage(stream, &a)
	r := reader(stream)
	var m, other protocol.Message
	mustRead(t, r, &m)
	first := m.Payload
	mustRead(t, r, &other)
	if string(first) != "aaaa" {
		t.Errorf("a read into another Message changed the payload to %q", first)
	}
	mustRead(t, r, &m)
	if unsafe.SliceData(m.Payload) != unsafe.SliceData(first) {
		t.Error("the second read into the same Message did not reuse its buffer")
	}
}

func TestReadMessageBadMagic(t *testing.T) {
	frame := encode(&protocol.Message{Header: request(1)})
	frame[0], frame[1] = 0xca, 0xfe
	var m protocol.Message
	err := protocol.ReadMessage(reader(frame), &m, 0)
	if !errors.Is(err, protocol.ErrBadMagic) {
		t.Fatalf("err = %v, want ErrBadMagic", err)
	}
	if !strings.Contains(err.Error(), "0xcafe") {
		t.Errorf("err %q does not show the bytes read", err)
	}
}

func TestReadMessageBodyTooLarge(t *testing.T) {
	header := func(n uint32) []byte {
		h := request(1)
		h.SetBodyLen(n)
		return h[:]
	}
	tests := []struct {
		name    string
		length  uint32
		maxBody uint32
	}{
		{"over a small limit", 1025, 1024},
		{"over the default limit", protocol.DefaultMaxBody + 1, 0},
		{"4 GiB claimed", 0xFFFFFFFF, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream := append(header(tt.length), make([]byte, 100)...)
			var m protocol.Message
			err := protocol.ReadMessage(reader(stream), &m, tt.maxBody)
			if !errors.Is(err, protocol.ErrBodyTooLarge) {
				t.Fatalf("err = %v, want ErrBodyTooLarge", err)
			}
			if m.Header.ID() != 1 || m.Header.BodyLen() != tt.length {
				t.Errorf("header not filled: % x", m.Header[:])
			}
			// Nothing of the claimed length is allocated: only the
			// error and the reader's own buffer.
			n := allocatedBytes(20, func() {
				var m protocol.Message
				_ = protocol.ReadMessage(reader(stream), &m, tt.maxBody)
			})
			if n > 8<<10 {
				t.Errorf("refusing the frame allocated %d bytes", n)
			}
		})
	}
	t.Run("at the limit", func(t *testing.T) {
		m := protocol.Message{Header: request(1), Payload: make([]byte, 1021)}
		frame := encode(&m) // body: 3 + 1021 bytes
		var got protocol.Message
		if err := protocol.ReadMessage(reader(frame), &got, 1024); err != nil {
			t.Fatalf("a body of exactly the limit: %v", err)
		}
	})
}

// A peer that claims a large length and then sends little makes the reader
// allocate in proportion to what arrived, not to the claim.
func TestReadMessageClaimedLengthNotAllocated(t *testing.T) {
	tests := []struct {
		name    string
		length  uint32
		maxBody uint32
	}{
		{"8 MiB at the default limit", protocol.DefaultMaxBody, 0},
		{"4 GiB under a 4 GiB limit", 0xFFFFFFFF, 0xFFFFFFFF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := request(1)
			h.SetBodyLen(tt.length)
			stream := append(h[:], make([]byte, 1000)...)
			var m protocol.Message
			err := protocol.ReadMessage(reader(stream), &m, tt.maxBody)
			if !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
			}
			n := allocatedBytes(10, func() {
				var m protocol.Message
				_ = protocol.ReadMessage(reader(stream), &m, tt.maxBody)
			})
			if n > 128<<10 {
				t.Errorf("a 1000-byte body claiming %d bytes allocated %d bytes", tt.length, n)
			}
		})
	}
}

func TestReadMessageTruncated(t *testing.T) {
	small := encode(&protocol.Message{Header: request(1), Service: "svc", Method: "m", Payload: []byte("payload")})
	large := encode(&protocol.Message{Header: request(2), Payload: make([]byte, 150<<10)})
	tests := []struct {
		name   string
		stream []byte
		want   error
	}{
		{"empty stream", nil, io.EOF},
		{"one header byte", small[:1], io.ErrUnexpectedEOF},
		{"15 header bytes", small[:15], io.ErrUnexpectedEOF},
		{"header only", small[:16], io.ErrUnexpectedEOF},
		{"body cut", small[:len(small)-1], io.ErrUnexpectedEOF},
		{"large body cut in the first chunk", large[:1000], io.ErrUnexpectedEOF},
		{"large body cut in a later chunk", large[:len(large)-1], io.ErrUnexpectedEOF},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m protocol.Message
			err := protocol.ReadMessage(reader(tt.stream), &m, 0)
			if err != tt.want {
				t.Errorf("err = %v, want %v", err, tt.want)
			}
		})
	}
	t.Run("clean boundary after a frame", func(t *testing.T) {
		r := reader(small)
		var m protocol.Message
		mustRead(t, r, &m)
		if err := protocol.ReadMessage(r, &m, 0); err != io.EOF {
			t.Errorf("err = %v, want io.EOF", err)
		}
	})
}

func TestReadMessageMalformed(t *testing.T) {
	tests := []struct {
		name string
		body string
	}{
		{"empty body", ""},
		{"service length unterminated", "\x80"},
		{"service length overflows", "\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01"},
		{"service longer than the body", "\x05abc"},
		{"method missing", "\x01s"},
		{"method longer than the body", "\x01s\x09m"},
		{"attachment count missing", "\x01s\x01m"},
		{"attachment count too large", "\x01s\x01m\x05\x01k\x01v"},
		{"attachment count huge", "\x01s\x01m\xff\xff\xff\xff\x0f"},
		{"attachments over the limit", "\x00\x00\x81\x08" + strings.Repeat("\x00\x00", 1025)},
		{"attachment key cut", "\x01s\x01m\x01\x05ke"},
		{"attachment value missing", "\x01s\x01m\x02\x01k\x01v\x01k"},
		{"attachment value cut", "\x01s\x01m\x01\x01k\x05va"},
		{"timeout not a number", "\x00\x00\x01\x07timeout\x03abc"},
		{"timeout negative", "\x00\x00\x01\x07timeout\x02-5"},
		{"timeout empty", "\x00\x00\x01\x07timeout\x00"},
		{"timeout with a unit", "\x00\x00\x01\x07timeout\x0410ms"},
		{"timeout too long", "\x00\x00\x01\x07timeout\x0d1000000000000"},
	}
	next := encode(&protocol.Message{Header: request(99), Service: "ok", Method: "next"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := request(42)
			h.SetBodyLen(uint32(len(tt.body)))
			stream := append(append(h[:], tt.body...), next...)
			r := reader(stream)
			var m protocol.Message
			err := protocol.ReadMessage(r, &m, 0)
			if !errors.Is(err, protocol.ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), "request id 42") {
				t.Errorf("err %q does not name the request id", err)
			}
			if m.Header.ID() != 42 || !m.Header.Flags().IsRequest() {
				t.Errorf("header not filled, a server cannot answer: % x", m.Header[:])
			}
			// The whole frame was consumed: the stream is still in step.
			if err := protocol.ReadMessage(r, &m, 0); err != nil {
				t.Fatalf("the frame after a malformed one: %v", err)
			}
			if m.Header.ID() != 99 || m.Method != "next" {
				t.Errorf("the frame after a malformed one read as id %d method %q", m.Header.ID(), m.Method)
			}
		})
	}
}

// Attachment values are decoded as given, duplicates keep the last value,
// and a non-minimal varint is accepted.
func TestReadMessageLenient(t *testing.T) {
	body := "\x01s" + // service "s"
		"\x81\x00m" + // method "m", its length as a non-minimal varint
		"\x03" + "\x01k\x01a" + "\x01k\x01b" + // duplicate key: the last wins
		"\x07timeout\x0500042" // leading zeros
	h := request(1)
	h.SetBodyLen(uint32(len(body)))
	var m protocol.Message
	if err := protocol.ReadMessage(reader(append(h[:], body...)), &m, 0); err != nil {
		t.Fatalf("ReadMessage: %v", err)
	}
	if m.Service != "s" || m.Method != "m" || m.Attachments["k"] != "b" || len(m.Attachments) != 1 || m.Timeout != 42*time.Millisecond {
		t.Errorf("read %+v", m)
	}
}

// ReadMessage accepts at most 12 digits of milliseconds, so AppendMessage
// caps a longer budget (10^12 ms, 31.7 years, or a "no deadline" of
// math.MaxInt64, where rounding up would overflow) at 999999999999 ms.
func TestHugeTimeoutRoundTrip(t *testing.T) {
	for _, d := range []time.Duration{1_000_000_000_000 * time.Millisecond, math.MaxInt64 - 1000, math.MaxInt64} {
		in := protocol.Message{Header: request(1), Service: "s", Method: "m", Timeout: d}
		var got protocol.Message
		if err := protocol.ReadMessage(reader(encode(&in)), &got, 0); err != nil {
			t.Errorf("Timeout %v: %v", d, err)
			continue
		}
		if got.Timeout < 999_999_999_999*time.Millisecond {
			t.Errorf("Timeout %v read back as %v", d, got.Timeout)
		}
	}
}

func TestMessageErr(t *testing.T) {
	var heartbeatResp protocol.Message
	if err := protocol.ReadMessage(reader(protocol.AppendHeartbeatResponse(nil, 1)), &heartbeatResp, 0); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		m    protocol.Message
		want *protocol.Error
	}{
		{"request", protocol.Message{Header: request(1)}, nil},
		{"ok response", protocol.Message{Header: response(1, protocol.StatusOK), Payload: []byte("x")}, nil},
		{"heartbeat response", heartbeatResp, nil},
		{"error response", protocol.Message{Header: response(1, protocol.StatusServiceNotFound), Payload: []byte("no such method")},
			&protocol.Error{Status: protocol.StatusServiceNotFound, Msg: "no such method", Remote: true}},
		{"error without text", protocol.Message{Header: response(1, protocol.StatusServerThreadpoolExhausted)},
			&protocol.Error{Status: protocol.StatusServerThreadpoolExhausted, Remote: true}},
		{"error with code and details", protocol.Message{Header: response(1, protocol.StatusBadRequest), Payload: []byte("no token"),
			Attachments: map[string]string{"error-code": "unauthenticated", "error-detail-0": "realm=pay", "error-detail-1": "", "trace": "t"}},
			&protocol.Error{Status: protocol.StatusBadRequest, Code: "unauthenticated", Msg: "no token",
				Details: []string{"realm=pay", ""}, Remote: true}},
		{"ok response with an error code", protocol.Message{Header: response(1, protocol.StatusOK),
			Attachments: map[string]string{"error-code": "x"}}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.m.Err()
			if tt.want == nil {
				if err != nil {
					t.Errorf("Err() = %v, want nil", err)
				}
				return
			}
			var e *protocol.Error
			if !errors.As(err, &e) {
				t.Fatalf("Err() = %v, want *Error", err)
			}
			if !reflect.DeepEqual(*e, *tt.want) {
				t.Errorf("Err() = %+v, want %+v", e, tt.want)
			}
		})
	}
}

func TestMessageReset(t *testing.T) {
	var m protocol.Message
	mustRead(t, reader(encode(&protocol.Message{
		Header: request(1), Service: "s", Method: "m", Timeout: time.Second,
		Attachments: map[string]string{"k": "v"}, Payload: []byte("p"),
	})), &m)
	m.Reset()
	if d := diffMessage(&m, &protocol.Message{}); d != "" || m.Attachments != nil {
		t.Errorf("after Reset: %s", d)
	}
}

func TestReaderInterns(t *testing.T) {
	m := protocol.Message{Header: request(1), Service: "inventory.Inventory", Method: "Deduct", Attachments: map[string]string{"trace": "1"}}
	stream := protocol.AppendMessage(encode(&m), &m)
	r := protocol.NewReader(reader(stream), 0)
	var a, b protocol.Message
	for _, x := range []*protocol.Message{&a, &b} {
		if err := r.Read(x); err != nil {
			t.Fatalf("Read: %v", err)
		}
		if d := diffMessage(x, &m); d != "" {
			t.Fatal(d)
		}
	}
	if unsafe.StringData(a.Service) != unsafe.StringData(b.Service) || unsafe.StringData(a.Method) != unsafe.StringData(b.Method) {
		t.Error("service and method are not interned across reads")
	}
	if err := r.Read(&a); err != io.EOF {
		t.Errorf("at the end: %v, want io.EOF", err)
	}
}

// More names than the Reader's recent slots, cycled twice: every read
// decodes its own name, and the second cycle returns the first's strings.
func TestReaderInternsManyNames(t *testing.T) {
	var stream []byte
	var want []string
	for range 2 {
		for i := range 7 {
			m := protocol.Message{Header: request(uint64(i + 1)), Service: "svc", Method: fmt.Sprintf("method%d", i)}
			stream = protocol.AppendMessage(stream, &m)
			want = append(want, m.Method)
		}
	}
	r := protocol.NewReader(reader(stream), 0)
	got := make([]string, len(want))
	for i := range want {
		var m protocol.Message
		if err := r.Read(&m); err != nil {
			t.Fatalf("Read %d: %v", i, err)
		}
		if m.Method != want[i] || m.Service != "svc" {
			t.Fatalf("read %d: %s.%s, want svc.%s", i, m.Service, m.Method, want[i])
		}
		got[i] = m.Method
	}
	for i := range 7 {
		if unsafe.StringData(got[i]) != unsafe.StringData(got[i+7]) {
			t.Errorf("method%d is not interned across reads", i)
		}
	}
}

func TestReaderLimit(t *testing.T) {
	frame := encode(&protocol.Message{Header: request(1), Payload: make([]byte, 100)})
	var m protocol.Message
	if err := protocol.NewReader(reader(frame), 50).Read(&m); !errors.Is(err, protocol.ErrBodyTooLarge) {
		t.Errorf("Read over the limit: %v, want ErrBodyTooLarge", err)
	}
	if err := protocol.NewReader(reader(frame), 0).Read(&m); err != nil {
		t.Errorf("Read under the default limit: %v", err)
	}
}

// typical is a request as the benchmarks and allocation tests use it.
func typical() *protocol.Message {
	return &protocol.Message{
		Header:  request(1),
		Service: "inventory.Inventory",
		Method:  "Deduct",
		Timeout: 1000 * time.Millisecond,
		Payload: bytes.Repeat([]byte{0x5a}, 64),
	}
}

func TestAppendMessageNoAllocs(t *testing.T) {
	m := typical()
	m.Attachments = map[string]string{"k": "v", "idempotency-key": "abc"}
	buf := make([]byte, 0, 512)
	if n := testing.AllocsPerRun(100, func() { buf = protocol.AppendMessage(buf[:0], m) }); n != 0 {
		t.Errorf("AppendMessage into a buffer with room: %v allocs/op, want 0", n)
	}
}

// Steady traffic of identical requests without attachments decodes with no
// allocation: names are interned, the body buffer is reused.
func TestReaderSteadyNoAllocs(t *testing.T) {
	r := protocol.NewReader(bufio.NewReader(&loopReader{data: encode(typical())}), 0)
	var m protocol.Message
	if err := r.Read(&m); err != nil {
		t.Fatal(err)
	}
	n := testing.AllocsPerRun(1000, func() {
		if err := r.Read(&m); err != nil {
			t.Fatal(err)
		}
	})
	if n != 0 {
		t.Errorf("Reader.Read of a steady stream: %v allocs/op, want 0", n)
	}
	if m.Method != "Deduct" || m.Timeout != time.Second {
		t.Errorf("read %+v", m)
	}
}

// Large bodies are read into pooled buffers that grow with what arrived;
// every size around the growth steps comes back intact, through short
// reads too, and a Message reused after Recycle reads the next one whole.
func TestReadLargeBodies(t *testing.T) {
	sizes := []int{64<<10 + 1, 1<<20 + 100, 2<<20 + 1, 3 << 20}
	for _, n := range sizes {
		payload := make([]byte, n)
		rand.NewChaCha8([32]byte{byte(n)}).Read(payload)
		in := protocol.Message{Header: request(uint64(n)), Service: "s", Method: "m", Payload: payload}
		frame := protocol.AppendMessage(nil, &in)
		readers := map[string]*bufio.Reader{
			"whole":           reader(frame),
			"4093-byte reads": bufio.NewReaderSize(&chunkReader{bytes.NewReader(frame), 4093}, 16),
		}
		for name, r := range readers {
			t.Run(strconv.Itoa(n)+"/"+name, func(t *testing.T) {
				var m protocol.Message
				if err := protocol.ReadMessage(r, &m, 0); err != nil {
					t.Fatalf("ReadMessage: %v", err)
				}
				if !bytes.Equal(m.Payload, payload) {
					t.Fatalf("payload of %d bytes read back as %d bytes, not equal", n, len(m.Payload))
				}
				m.Recycle()
				if err := protocol.ReadMessage(reader(frame), &m, 0); err != nil {
					t.Fatalf("ReadMessage after Recycle: %v", err)
				}
				if !bytes.Equal(m.Payload, payload) || m.Service != "s" || m.Method != "m" {
					t.Fatalf("second read after Recycle differs")
				}
				m.Recycle()
				if m.Payload != nil || m.Service != "" {
					t.Fatalf("Recycle left %q with a %d-byte payload", m.Service, len(m.Payload))
				}
			})
		}
	}
}

// AppendFrameHead followed by the payload is AppendMessage, for every kind
// of frame.
func TestAppendFrameHead(t *testing.T) {
	var resp protocol.Header
	resp.Init(protocol.MakeFlags(0, 22), protocol.StatusOK, 7)
	event := protocol.AppendHeartbeat(nil, 9)
	var ev protocol.Message
	if err := protocol.ReadMessage(reader(event), &ev, 0); err != nil {
		t.Fatalf("reading a heartbeat: %v", err)
	}
	tests := []struct {
		name string
		m    *protocol.Message
	}{
		{"request", typical()},
		{"request, large payload", &protocol.Message{Header: request(2), Service: "s", Method: "m",
			Timeout: time.Second, Payload: make([]byte, 100<<10)}},
		{"response", &protocol.Message{Header: resp, Payload: []byte("reply")}},
		{"event", &ev},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := protocol.AppendMessage(nil, tt.m)
			got := append(protocol.AppendFrameHead([]byte("prefix"), tt.m), tt.m.Payload...)
			if !bytes.Equal(got[len("prefix"):], want) {
				t.Errorf("AppendFrameHead + payload:\n got %x\nwant %x", got[len("prefix"):min(len(got), 64)], want[:min(len(want), 58)])
			}
		})
	}
}

// The idempotency key is read into its own field, never into the map, so
// a request whose only attachment is the key decodes without a map; on
// write a non-empty field is sent and wins over a map entry.
func TestIdempotencyKeyField(t *testing.T) {
	tests := []struct {
		name       string
		in         protocol.Message
		wantKey    string
		wantAttach map[string]string
	}{
		{"from the map", protocol.Message{Header: request(1),
			Attachments: map[string]string{protocol.AttachIdempotencyKey: "k-map"}}, "k-map", nil},
		{"from the field", protocol.Message{Header: request(2), IdempotencyKey: "k-field"}, "k-field", nil},
		{"field wins over the map", protocol.Message{Header: request(3), IdempotencyKey: "k-field",
			Attachments: map[string]string{protocol.AttachIdempotencyKey: "k-map", "trace": "t"}},
			"k-field", map[string]string{"trace": "t"}},
		{"no key", protocol.Message{Header: request(4), Attachments: map[string]string{"trace": "t"}},
			"", map[string]string{"trace": "t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got protocol.Message
			if err := protocol.ReadMessage(reader(protocol.AppendMessage(nil, &tt.in)), &got, 0); err != nil {
				t.Fatalf("ReadMessage: %v", err)
			}
			if got.IdempotencyKey != tt.wantKey {
				t.Errorf("IdempotencyKey = %q, want %q", got.IdempotencyKey, tt.wantKey)
			}
			if tt.wantAttach == nil && got.Attachments != nil {
				t.Errorf("Attachments = %q, want nil (no map for the key alone)", got.Attachments)
			}
			if tt.wantAttach != nil && !maps.Equal(got.Attachments, tt.wantAttach) {
				t.Errorf("Attachments = %q, want %q", got.Attachments, tt.wantAttach)
			}
		})
	}
}

// TestReaderDoesNotInternLongNames: a peer sending long names (valid
// frames, answered "service not found") must not pin them to the
// connection: only short names are kept in the intern table.
func TestReaderDoesNotInternLongNames(t *testing.T) {
	long := strings.Repeat("s", 64<<10)
	var stream []byte
	for i := range 2 {
		m := protocol.Message{Header: request(uint64(i + 1)), Service: long, Method: "M"}
		stream = protocol.AppendMessage(stream, &m)
	}
	r := protocol.NewReader(reader(stream), 0)
	var got [2]protocol.Message
	for i := range got {
		if err := r.Read(&got[i]); err != nil {
			t.Fatalf("Read %d: %v", i, err)
		}
	}
	if got[0].Service != long || got[1].Service != long {
		t.Fatal("the long service name did not round-trip")
	}
	if unsafe.StringData(got[0].Service) == unsafe.StringData(got[1].Service) {
		t.Error("a 64 KiB service name was interned: the connection keeps it")
	}
	if unsafe.StringData(got[0].Method) != unsafe.StringData(got[1].Method) {
		t.Error("the short method name was not interned")
	}
}

// attachmentFrame returns a request frame with id whose body is empty
// service and method names and then count attachment pairs, pair(i)
// encoding the i-th (key and value, each with its length).
func attachmentFrame(id uint64, count int, pair func(dst []byte, i int) []byte) []byte {
	body := []byte{0, 0}
	body = binary.AppendUvarint(body, uint64(count))
	for i := range count {
		body = pair(body, i)
	}
	h := request(id)
	h.SetBodyLen(uint32(len(body)))
	return append(h[:], body...)
}

// distinctKeys encodes pair i as a distinct 3-byte key with an empty
// value: 5 bytes a pair, the cheapest distinct pairs on the wire.
func distinctKeys(dst []byte, i int) []byte {
	return append(dst, 3, byte(i>>16), byte(i>>8), byte(i), 0)
}

// emptyPair encodes every pair as an empty key with an empty value.
func emptyPair(dst []byte, _ int) []byte { return append(dst, 0, 0) }

// TestAttachmentFloodRefused: a body within the default limit (8 MiB) made
// only of attachment pairs claims some millions of them, which the body
// can hold. Decoding them all (distinct 3-byte keys with empty values
// made 1.7 million map entries, 176 MiB allocated per frame) is refused:
// the frame is malformed, after it was read whole, so a server answers
// the request named in its header with 40 and the next frame reads.
func TestAttachmentFloodRefused(t *testing.T) {
	const body = int(protocol.DefaultMaxBody)
	tests := []struct {
		name  string
		frame []byte
	}{
		{"distinct keys", attachmentFrame(42, (body-6)/5, distinctKeys)},
		{"one pair repeated", attachmentFrame(42, (body-6)/2, emptyPair)},
	}
	next := encode(&protocol.Message{Header: request(99), Service: "ok", Method: "next"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stream := append(tt.frame[:len(tt.frame):len(tt.frame)], next...)
			r := protocol.NewReader(reader(stream), 0) // as a server reads
			var m protocol.Message
			err := r.Read(&m)
			if !errors.Is(err, protocol.ErrMalformed) || !errors.Is(err, protocol.ErrTooManyAttachments) {
				t.Fatalf("err = %v, want ErrMalformed and ErrTooManyAttachments", err)
			}
			if want := fmt.Sprintf("limit %d", protocol.MaxAttachments); !strings.Contains(err.Error(), want) {
				t.Errorf("err %q does not say %q", err, want)
			}
			if m.Header.ID() != 42 || !m.Header.Flags().IsTwoWay() {
				t.Errorf("header not filled, a server cannot answer: % x", m.Header[:])
			}
			if m.Attachments != nil {
				t.Errorf("%d attachments decoded from a refused frame", len(m.Attachments))
			}
			if err := r.Read(&m); err != nil {
				t.Fatalf("the frame after the refused one: %v", err)
			}
			if m.Header.ID() != 99 || m.Method != "next" {
				t.Errorf("the frame after the refused one read as id %d method %q", m.Header.ID(), m.Method)
			}

			// What the read costs is the body (read in growing chunks)
			// and the reader's buffer: no more than twice the frame.
			n := allocatedBytes(3, func() {
				var m protocol.Message
				_ = protocol.NewReader(reader(tt.frame), 0).Read(&m)
				m.Recycle()
			})
			if limit := 2 * uint64(len(tt.frame)); n > limit {
				t.Errorf("reading the refused %d-byte frame allocated %d MiB, want at most %d MiB",
					len(tt.frame), n>>20, limit>>20)
			}
		})
	}
}

// TestAttachmentLimitCounts: MaxAttachments counts what goes on the wire,
// the timeout and idempotency key included and a map entry they replace
// excluded. A message at the limit passes CheckAttachments and reads back;
// one more is refused by CheckAttachments, and by a receiver as
// malformed if it is written anyway.
func TestAttachmentLimitCounts(t *testing.T) {
	withMap := func(n int, extra map[string]string) map[string]string {
		a := make(map[string]string, n+len(extra))
		for i := range n {
			a[fmt.Sprintf("k%d", i)] = "v"
		}
		maps.Copy(a, extra)
		return a
	}
	const limit = protocol.MaxAttachments
	tests := []struct {
		name string
		m    protocol.Message
		wire int // the attachment count on the wire
	}{
		{"map alone", protocol.Message{Attachments: withMap(limit, nil)}, limit},
		{"timeout and key fields", protocol.Message{Timeout: time.Second, IdempotencyKey: "k",
			Attachments: withMap(limit-2, nil)}, limit},
		{"timeout in the map is not sent", protocol.Message{Attachments: withMap(limit,
			map[string]string{protocol.AttachTimeout: "5"})}, limit},
		{"key in the map replaced by the field", protocol.Message{IdempotencyKey: "k",
			Attachments: withMap(limit-1, map[string]string{protocol.AttachIdempotencyKey: "old"})}, limit},
		{"key in the map sent", protocol.Message{Attachments: withMap(limit-1,
			map[string]string{protocol.AttachIdempotencyKey: "k"})}, limit},
		{"map one over", protocol.Message{Attachments: withMap(limit+1, nil)}, limit + 1},
		{"timeout one over", protocol.Message{Timeout: time.Second, Attachments: withMap(limit, nil)}, limit + 1},
		{"key one over", protocol.Message{IdempotencyKey: "k", Attachments: withMap(limit, nil)}, limit + 1},
	}
	next := encode(&protocol.Message{Header: request(99), Service: "ok", Method: "next"})
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := tt.m
			m.Header = request(7)
			m.Service, m.Method, m.Payload = "s", "m", []byte("payload")
			err := protocol.CheckAttachments(&m)
			frame := encode(&m)
			if got := protocol.BodyLen(&m); got != len(frame)-protocol.HeaderLen {
				t.Errorf("BodyLen = %d, AppendMessage wrote %d", got, len(frame)-protocol.HeaderLen)
			}
			r := reader(append(frame, next...))
			var got protocol.Message
			rerr := protocol.ReadMessage(r, &got, 0)
			if tt.wire <= limit {
				if err != nil {
					t.Fatalf("CheckAttachments: %v", err)
				}
				if rerr != nil {
					t.Fatalf("ReadMessage: %v", rerr)
				}
				want := m
				want.Attachments = maps.Clone(m.Attachments)
				delete(want.Attachments, protocol.AttachTimeout) // never sent from the map
				if d := diffMessage(&got, &want); d != "" {
					t.Fatal(d)
				}
			} else {
				if !errors.Is(err, protocol.ErrTooManyAttachments) {
					t.Fatalf("CheckAttachments = %v, want ErrTooManyAttachments", err)
				}
				if want := fmt.Sprintf("%d, limit %d", tt.wire, limit); !strings.Contains(err.Error(), want) {
					t.Errorf("CheckAttachments = %q, want it to say %q", err, want)
				}
				if !errors.Is(rerr, protocol.ErrMalformed) || !errors.Is(rerr, protocol.ErrTooManyAttachments) {
					t.Fatalf("ReadMessage = %v, want ErrMalformed and ErrTooManyAttachments", rerr)
				}
			}
			if err := protocol.ReadMessage(r, &got, 0); err != nil || got.Header.ID() != 99 {
				t.Fatalf("the frame after: id %d, %v", got.Header.ID(), err)
			}
		})
	}

	// Events carry Dubbo's bodies, never attachments.
	ev := protocol.Message{Attachments: withMap(limit+1, nil)}
	ev.Header.Init(protocol.MakeFlags(protocol.FlagEvent, 2), 0, 1)
	if err := protocol.CheckAttachments(&ev); err != nil {
		t.Errorf("CheckAttachments of an event: %v", err)
	}
}

// TestAttachmentsAtTheLimitCost: the most expensive frame a peer may send
// now, MaxAttachments distinct short keys with empty values (about 5 KiB
// on the wire), costs a bounded amount to decode and keep: about 100 KiB
// (measured), checked here against 256 KiB.
func TestAttachmentsAtTheLimitCost(t *testing.T) {
	frame := attachmentFrame(1, protocol.MaxAttachments, func(dst []byte, i int) []byte {
		return append(dst, 2, byte(i>>8), byte(i), 0)
	})
	const runs = 10
	ms := make([]protocol.Message, runs)
	var before, after runtime.MemStats
	runtime.GC()
	runtime.GC() // and what sync.Pools (the body buffers' pool) held over the first
	runtime.ReadMemStats(&before)
	for i := range ms {
		if err := protocol.ReadMessage(reader(frame), &ms[i], 0); err != nil {
			t.Fatalf("ReadMessage: %v", err)
		}
	}
	runtime.ReadMemStats(&after)
	allocated := (after.TotalAlloc - before.TotalAlloc) / runs
	runtime.GC()
	runtime.ReadMemStats(&after)
	kept := (int64(after.HeapAlloc) - int64(before.HeapAlloc)) / runs
	for i := range ms {
		if len(ms[i].Attachments) != protocol.MaxAttachments {
			t.Fatalf("decoded %d attachments, want %d", len(ms[i].Attachments), protocol.MaxAttachments)
		}
	}
	runtime.KeepAlive(ms)
	t.Logf("%d-byte frame: %d KiB allocated, %d KiB kept per message", len(frame), allocated>>10, kept>>10)
	const limit = 256 << 10
	if allocated > limit || kept > limit {
		t.Errorf("a %d-byte frame of %d attachments allocated %d KiB and kept %d KiB, want at most %d KiB each",
			len(frame), protocol.MaxAttachments, allocated>>10, kept>>10, limit>>10)
	}
}

// A body buffer no budget counts grows with the bytes that arrived, and
// takes the length the header claims only once an eighth of it is in: a
// peer that claims 8 MiB and sends little costs little.
func TestReadBodyAllocatesAsBytesArrive(t *testing.T) {
	const claimed = 8 << 20
	for _, sent := range []int{100, 64 << 10, 1 << 20, 4 << 20} {
		t.Run(strconv.Itoa(sent), func(t *testing.T) {
			h := request(1)
			h.SetMagic()
			binary.BigEndian.PutUint32(h[12:16], claimed)
			stream := append(h[:], make([]byte, sent)...)
			n := allocatedBytes(3, func() {
				var m protocol.Message
				if err := protocol.ReadMessage(reader(stream), &m, 0); err != io.ErrUnexpectedEOF {
					t.Errorf("err = %v, want io.ErrUnexpectedEOF", err)
				}
			})
			// Twice what arrived, rounded up to a pool class, and the
			// buffers it grew through.
			if limit := uint64(4*sent + 64<<10); n > limit {
				t.Errorf("reading %d of a claimed %d bytes allocated %d KiB, want at most %d KiB",
					sent, claimed, n>>10, limit>>10)
			}
		})
	}
}

// budgetLog records a Reader's use of its Budget.
type budgetLog struct {
	acquired, released []int
	err                error
}

func (b *budgetLog) Acquire(n int) error {
	if b.err != nil {
		return b.err
	}
	b.acquired = append(b.acquired, n)
	return nil
}

func (b *budgetLog) Release(n int) { b.released = append(b.released, n) }

// A Reader takes each body over BudgetMin from its Budget, whole, and
// gives it back once read, whatever the outcome; smaller bodies and
// reused buffers do not ask.
func TestReaderBudget(t *testing.T) {
	small := encode(&protocol.Message{Header: request(1), Payload: make([]byte, 1000)})
	large := encode(&protocol.Message{Header: request(2), Payload: make([]byte, 200<<10)})
	largeBody := len(large) - protocol.HeaderLen

	t.Run("small and large", func(t *testing.T) {
		var b budgetLog
		r := protocol.NewReader(reader(slices.Concat(small, large)), 0)
		r.SetBudget(&b)
		var m protocol.Message
		for range 2 {
			if err := r.Read(&m); err != nil {
				t.Fatal(err)
			}
		}
		if !slices.Equal(b.acquired, []int{largeBody}) || !slices.Equal(b.released, b.acquired) {
			t.Errorf("acquired %v, released %v; want [%d] both", b.acquired, b.released, largeBody)
		}
	})
	t.Run("cut short", func(t *testing.T) {
		var b budgetLog
		r := protocol.NewReader(reader(large[:len(large)/2]), 0)
		r.SetBudget(&b)
		var m protocol.Message
		if err := r.Read(&m); err != io.ErrUnexpectedEOF {
			t.Fatalf("err = %v, want io.ErrUnexpectedEOF", err)
		}
		if !slices.Equal(b.acquired, []int{largeBody}) || !slices.Equal(b.released, b.acquired) {
			t.Errorf("acquired %v, released %v; want [%d] both", b.acquired, b.released, largeBody)
		}
	})
	t.Run("refused", func(t *testing.T) {
		stop := errors.New("closed")
		b := budgetLog{err: stop}
		r := protocol.NewReader(reader(large), 0)
		r.SetBudget(&b)
		var m protocol.Message
		if err := r.Read(&m); !errors.Is(err, stop) {
			t.Fatalf("err = %v, want the budget's error", err)
		}
		if len(b.released) != 0 {
			t.Errorf("released %v of a budget never taken", b.released)
		}
	})
}

// A large body goes into one buffer of its whole length once its first
// bytes have arrived when a Budget counts it, and once an eighth has
// arrived otherwise: it is not copied through a chain of doubling buffers.
// The stream comes in 16 KiB reads, as from a socket.
func TestReadBodySizedFromHeader(t *testing.T) {
	const n = 1 << 20
	frame := encode(&protocol.Message{Header: request(3), Service: "s", Method: "m", Payload: make([]byte, n)})
	body := len(frame) - protocol.HeaderLen
	class := uint64(2 << 20) // the pool class that holds body
	for _, tt := range []struct {
		name   string
		budget bool
		limit  uint64
	}{
		{"budget", true, class},
		// Doubling from 16 KiB to 128 KiB, then the whole body.
		{"no budget", false, class + 256<<10},
	} {
		t.Run(tt.name, func(t *testing.T) {
			runtime.GC() // empty the buffer pool: twice, for its victim cache
			runtime.GC()
			var b budgetLog
			got := allocatedBytes(3, func() {
				r := protocol.NewReader(bufio.NewReaderSize(&chunkReader{bytes.NewReader(frame), 16 << 10}, 16<<10), 0)
				if tt.budget {
					r.SetBudget(&b)
				}
				var m protocol.Message // not recycled: every read needs a new buffer
				if err := r.Read(&m); err != nil {
					t.Fatalf("Read: %v", err)
				}
				if len(m.Payload) != n {
					t.Fatalf("payload of %d bytes, want %d", len(m.Payload), n)
				}
			})
			// The reader's own 16 KiB buffer and the chunk reader come on top.
			if limit := tt.limit + 64<<10; got > limit {
				t.Errorf("reading a %d-byte body allocated %d KiB per read, want at most %d KiB", body, got>>10, limit>>10)
			}
		})
	}
}
