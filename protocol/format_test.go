package protocol_test

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/internal/formattest"
	"github.com/dabbrpc/dabb/protocol"
)

// Every test of the package runs with the toy format (id 30) and the
// panicking one (id 29) registered, so dabb's layout is checked with
// formats present, as a program with the dubbo module has them.
func init() {
	formattest.Register()
	protocol.RegisterBodyFormat(panicking{})
}

// panicking is the toy format under id 29, except that its decoder
// panics on the body "panic!", as a buggy decoder fed a hostile body might.
type panicking struct{ formattest.Format }

func (panicking) ID() byte     { return 29 }
func (panicking) Name() string { return "panicking" }
func (p panicking) DecodeBody(m *protocol.Message, body []byte) error {
	if string(body) != "panic!" {
		return p.Format.DecodeBody(m, body)
	}
	m.Header.SetFlags(0) // not kept: only the status byte is the format's
	var table []int
	_ = table[len(body)] // index out of range
	return nil
}

// toyHeader returns a header in the toy's serialization.
func toyHeader(kind protocol.Flags, s protocol.Status, id uint64) protocol.Header {
	var h protocol.Header
	h.Init(protocol.MakeFlags(kind, formattest.ID), s, id)
	return h
}

func TestRegisterBodyFormatRefuses(t *testing.T) {
	mustPanic := func(what, want string, f func()) {
		t.Helper()
		defer func() {
			v := recover()
			if v == nil || !strings.Contains(fmt.Sprint(v), want) {
				t.Errorf("%s: panic %v, want one saying %q", what, v, want)
			}
		}()
		f()
	}
	mustPanic("nil", "nil format", func() { protocol.RegisterBodyFormat(nil) })
	mustPanic("id 32", "five bits", func() { protocol.RegisterBodyFormat(idFormat(32)) })
	mustPanic("twice", `registered twice ("toy" and "id30")`, func() { protocol.RegisterBodyFormat(idFormat(30)) })
	if f := protocol.LookupBodyFormat(formattest.ID); f == nil || f.Name() != "toy" {
		t.Errorf("LookupBodyFormat(30) = %v after a refused duplicate, want the toy", f)
	}
	for _, id := range []byte{0, 2, 16, 22, 31, 200} {
		if f := protocol.LookupBodyFormat(id); f != nil {
			t.Errorf("LookupBodyFormat(%d) = %q, want nil (dabb's layout)", id, f.Name())
		}
	}
}

type idFormat byte

func (f idFormat) ID() byte                                                          { return byte(f) }
func (f idFormat) Name() string                                                      { return fmt.Sprintf("id%d", byte(f)) }
func (idFormat) AppendBody(_ *protocol.Header, d []byte, _ *protocol.Message) []byte { return d }
func (idFormat) DecodeBody(*protocol.Message, []byte) error                          { return nil }

// A request in the toy's id is laid out by the toy, not in dabb's layout,
// and reads back with the timeout and idempotency key in their fields.
func TestBodyFormatRequest(t *testing.T) {
	in := &protocol.Message{
		Header:         toyHeader(protocol.FlagRequest|protocol.FlagTwoWay, 0, 7),
		Service:        "com.example.Inventory",
		Method:         "deduct",
		Timeout:        1500*time.Millisecond + 1, // rounded up to 1501 ms
		IdempotencyKey: "k-1",
		Attachments:    map[string]string{"version": "1.0.0", protocol.AttachTimeout: "9"},
		Payload:        []byte("args"),
	}
	frame := encode(in)
	body := frame[protocol.HeaderLen:]
	if body[0] != formattest.KindRequest {
		t.Fatalf("body % x does not start with the toy's request kind", body)
	}
	if protocol.PayloadAtEnd(in) || bytes.HasSuffix(frame, in.Payload) {
		t.Errorf("PayloadAtEnd = %v; the toy writes its attachments after the payload", protocol.PayloadAtEnd(in))
	}
	if n := protocol.BodyLen(in); n != len(body) {
		t.Errorf("BodyLen = %d, the frame's body is %d", n, len(body))
	}
	if got := binary.BigEndian.Uint32(frame[12:16]); int(got) != len(body) {
		t.Errorf("header says %d body bytes, body is %d", got, len(body))
	}
	want := &protocol.Message{Header: in.Header, Service: in.Service, Method: in.Method, Timeout: 1501 * time.Millisecond,
		IdempotencyKey: "k-1", Attachments: map[string]string{"version": "1.0.0"}, Payload: in.Payload}
	for _, read := range readers {
		var got protocol.Message
		if err := read(frame, &got); err != nil {
			t.Fatal(err)
		}
		if d := diffMessage(&got, want); d != "" {
			t.Error(d)
		}
		if _, ok := got.Attachments[protocol.AttachTimeout]; ok || got.IdempotencyKey != "k-1" {
			t.Errorf("timeout or key left in the map: %q, key %q", got.Attachments, got.IdempotencyKey)
		}
	}
}

// readers are the two ways to read a frame: ReadMessage and a Reader.
var readers = []func([]byte, *protocol.Message) error{
	func(b []byte, m *protocol.Message) error { return protocol.ReadMessage(reader(b), m, 0) },
	func(b []byte, m *protocol.Message) error { return protocol.NewReader(reader(b), 0).Read(m) },
}

// Responses: a value, a handler's error sent as an exception under
// status 20 (the format sets the status byte both ways), and a status of
// the server's own with its code.
func TestBodyFormatResponses(t *testing.T) {
	for _, tc := range []struct {
		name     string
		status   protocol.Status
		err      *protocol.Error
		wire     protocol.Status
		kind     byte
		wantText string
	}{
		{"value", protocol.StatusOK, nil, protocol.StatusOK, formattest.KindValue, ""},
		{"exception", protocol.StatusServiceError, &protocol.Error{Status: 70, Msg: "stock short"}, protocol.StatusOK, formattest.KindException, "stock short"},
		{"unimplemented", protocol.StatusServiceNotFound, &protocol.Error{Status: 60, Code: protocol.CodeUnimplemented, Msg: "no such method"}, 60, formattest.KindStatus, "no such method"},
		{"overload", protocol.StatusServerThreadpoolExhausted, &protocol.Error{Status: 100, Msg: "busy"}, 100, formattest.KindStatus, "busy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := &protocol.Message{Header: toyHeader(0, tc.status, 9), Payload: []byte("reply")}
			if tc.err != nil {
				m.SetError(tc.err)
			}
			frame := encode(m)
			if s := protocol.Status(frame[3]); s != tc.wire || frame[protocol.HeaderLen] != tc.kind {
				t.Fatalf("wire status %d kind %q, want %d %q", s, frame[protocol.HeaderLen], tc.wire, tc.kind)
			}
			if m.Header.Status() != tc.status {
				t.Errorf("AppendMessage changed the message's own status to %d", m.Header.Status())
			}
			var got protocol.Message
			mustRead(t, reader(frame), &got)
			if got.Header.Status() != tc.status {
				t.Errorf("read status %d, want %d", got.Header.Status(), tc.status)
			}
			err := got.Err()
			if tc.err == nil {
				if err != nil || string(got.Payload) != "reply" {
					t.Errorf("Err %v, payload %q", err, got.Payload)
				}
				return
			}
			var pe *protocol.Error
			if !errors.As(err, &pe) || pe.Status != tc.status || pe.Msg != tc.wantText || pe.Code != tc.err.Code || !pe.Remote {
				t.Errorf("Err() = %#v, want status %d, text %q, code %q", err, tc.status, tc.wantText, tc.err.Code)
			}
		})
	}
}

// Bodies the toy cannot decode are malformed: the whole frame is consumed,
// the header names the request, and the next frame reads.
func TestBodyFormatMalformed(t *testing.T) {
	good := encode(&protocol.Message{Header: toyHeader(protocol.FlagRequest|protocol.FlagTwoWay, 0, 2), Service: "s", Method: "m"})
	frame := func(h protocol.Header, body []byte) []byte {
		h.SetBodyLen(uint32(len(body)))
		return append(h[:], body...)
	}
	req := toyHeader(protocol.FlagRequest|protocol.FlagTwoWay, 0, 1)
	str := func(b []byte, s string) []byte { return append(binary.BigEndian.AppendUint32(b, uint32(len(s))), s...) }
	badTimeout := binary.BigEndian.AppendUint32(str(str(str([]byte{'Q'}, ""), ""), ""), 1)
	badTimeout = str(str(badTimeout, protocol.AttachTimeout), "1s")
	many := binary.BigEndian.AppendUint32([]byte{'Q', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, protocol.MaxAttachments+1)
	many = append(many, make([]byte, 8*(protocol.MaxAttachments+1))...)
	for _, tc := range []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty body", frame(req, nil), formattest.ErrShort},
		{"truncated", frame(req, []byte{'Q', 0, 0, 0, 9, 'a'}), formattest.ErrShort},
		{"wrong kind", frame(req, []byte{'V', 0, 0, 0, 0, 0, 0, 0, 0}), formattest.ErrKind},
		{"dabb's layout", frame(req, []byte{0, 0, 0}), formattest.ErrKind},
		{"bad timeout", frame(req, badTimeout), nil},
		{"too many attachments", frame(req, many), nil},
		{"decoder panics", frame(func() protocol.Header {
			var h protocol.Header
			h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 29), 0, 1)
			return h
		}(), []byte("panic!")), nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := reader(append(append([]byte{}, tc.frame...), good...))
			var m protocol.Message
			err := protocol.ReadMessage(r, &m, 0)
			if !errors.Is(err, protocol.ErrMalformed) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("err %v, want ErrMalformed (and %v)", err, tc.want)
			}
			if m.Header.ID() != 1 || !m.Header.Flags().IsRequest() || !m.Header.Flags().IsTwoWay() {
				t.Errorf("header after the error % x does not name the request", m.Header[:12])
			}
			mustRead(t, r, &m)
			if m.Header.ID() != 2 || m.Service != "s" {
				t.Errorf("next frame read as id %d service %q: out of step", m.Header.ID(), m.Service)
			}
		})
	}
}

// Events keep Dubbo's bodies whatever their serialization id: a format
// does not touch them.
func TestBodyFormatNotForEvents(t *testing.T) {
	for _, id := range []byte{formattest.ID, 29} {
		m := &protocol.Message{Header: func() protocol.Header {
			var h protocol.Header
			h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay|protocol.FlagEvent, id), 0, 3)
			return h
		}(), Payload: []byte{0x4e}}
		if !protocol.PayloadAtEnd(m) {
			t.Errorf("id %d: PayloadAtEnd false for an event", id)
		}
		frame := encode(m)
		if !bytes.Equal(frame[protocol.HeaderLen:], []byte{0x4e}) {
			t.Errorf("id %d: event body % x, want 4e", id, frame[protocol.HeaderLen:])
		}
		var got protocol.Message
		mustRead(t, reader(frame), &got)
		if !got.IsHeartbeat() || !bytes.Equal(got.Payload, []byte{0x4e}) {
			t.Errorf("id %d: read %+v, want a heartbeat", id, got)
		}
	}
}

// AppendFrameHead is for frames whose payload ends them; for a format's
// frame it panics, saying why, instead of writing a broken frame.
func TestAppendFrameHeadRefusesFormats(t *testing.T) {
	defer func() {
		if v := recover(); v == nil || !strings.Contains(fmt.Sprint(v), "toy") {
			t.Errorf("panic %v, want one naming the toy format", v)
		}
	}()
	protocol.AppendFrameHead(nil, &protocol.Message{Header: toyHeader(protocol.FlagRequest, 0, 1)})
}

// WireAttachments yields what dabb's layout writes: the timeout in whole
// milliseconds, rounded up ("0" when spent), the key from its field,
// then the map without the two.
func TestWireAttachments(t *testing.T) {
	for _, tc := range []struct {
		m    protocol.Message
		want map[string]string
	}{
		{protocol.Message{}, map[string]string{}},
		{protocol.Message{Timeout: -1}, map[string]string{"timeout": "0"}},
		{protocol.Message{Timeout: time.Millisecond + 1, IdempotencyKey: "k",
			Attachments: map[string]string{"timeout": "5", "idempotency-key": "old", "a": "b"}},
			map[string]string{"timeout": "2", "idempotency-key": "k", "a": "b"}},
		{protocol.Message{Attachments: map[string]string{"idempotency-key": "old"}}, map[string]string{"idempotency-key": "old"}},
	} {
		got := map[string]string{}
		n := 0
		for k, v := range tc.m.WireAttachments() {
			got[k] = v
			n++
		}
		if !maps.Equal(got, tc.want) || n != len(tc.want) {
			t.Errorf("%+v: yielded %d pairs %q, want %q", tc.m, n, got, tc.want)
		}
		for range tc.m.WireAttachments() {
			break // stopping early must not panic
		}
	}
}

// With formats registered, dabb's own layout allocates nothing more than
// without them: nothing to append, nothing to read a steady stream.
func TestDabbLayoutNoAllocsWithFormats(t *testing.T) {
	if protocol.LookupBodyFormat(formattest.ID) == nil {
		t.Fatal("the toy format is not registered")
	}
	m := typical()
	m.IdempotencyKey = "k"
	buf := make([]byte, 0, 512)
	for name, f := range map[string]func(){
		"AppendMessage":   func() { buf = protocol.AppendMessage(buf[:0], m) },
		"AppendFrameHead": func() { buf = protocol.AppendFrameHead(buf[:0], m) },
		"BodyLen":         func() { sinkU64 += uint64(protocol.BodyLen(m)) },
		"PayloadAtEnd":    func() { _ = protocol.PayloadAtEnd(m) },
	} {
		if n := testing.AllocsPerRun(1000, f); n != 0 {
			t.Errorf("%s: %v allocs/op, want 0", name, n)
		}
	}
	r := protocol.NewReader(bufio.NewReader(&loopReader{data: encode(typical())}), 0)
	var got protocol.Message
	if n := testing.AllocsPerRun(1000, func() {
		if err := r.Read(&got); err != nil {
			t.Fatal(err)
		}
	}); n != 0 {
		t.Errorf("Reader.Read: %v allocs/op, want 0", n)
	}
}
