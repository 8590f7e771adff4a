package protocol_test

import (
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// TestHessianString: strings of every length class (one-byte, two-byte,
// 'S' and chunked 'R' lengths) and outside the BMP round-trip, and the
// lengths count UTF-16 units as Java's Hessian does.
func TestHessianString(t *testing.T) {
	for _, s := range []string{
		"", "service 2.0.2 not found", strings.Repeat("a", 31), strings.Repeat("b", 32),
		strings.Repeat("é", 1023), strings.Repeat("c", 1024), strings.Repeat("d", 70000),
		"emoji 😀 and 中文",
	} {
		b := protocol.AppendHessianString(nil, s)
		got, rest, err := protocol.DecodeHessianString(append(b, 'X'))
		if err != nil || got != s || string(rest) != "X" {
			t.Fatalf("len %d: decoded %d runes, rest %q, err %v", len(s), len([]rune(got)), rest, err)
		}
	}
	// Known encodings: a short string's length byte; "😀" is two units.
	if b := protocol.AppendHessianString(nil, "hi"); string(b) != "\x02hi" {
		t.Errorf(`"hi" = %q, want "\x02hi"`, b)
	}
	if b := protocol.AppendHessianString(nil, "😀"); len(b) != 7 || b[0] != 2 {
		t.Errorf(`"😀" = % x, want length 2 and two 3-byte surrogates`, b)
	}
	if b := protocol.AppendHessianString(nil, strings.Repeat("x", 100)); b[0] != 0x30 || b[1] != 100 {
		t.Errorf("100 units: length bytes % x, want 30 64", b[:2])
	}
	for _, bad := range [][]byte{nil, {0x05, 'a'}, {0x31}, {'S', 0}, {0x40}} {
		if _, _, err := protocol.DecodeHessianString(bad); err == nil {
			t.Errorf("% x decoded without error", bad)
		}
	}
}

// TestAppendForeignError: the body is the message in the request's
// serialization: a hessian2 string for 2, a JSON string for fastjson, the
// text for others (fastjson2 writes binary JSONB); the header answers the request.
func TestAppendForeignError(t *testing.T) {
	const msg = `serialization hessian2 (id 2) is not spoken by this dabb server`
	for _, tt := range []struct {
		id   byte
		body func(t *testing.T, b []byte) string
	}{
		{2, func(t *testing.T, b []byte) string {
			s, rest, err := protocol.DecodeHessianString(b)
			if err != nil || len(rest) != 0 {
				t.Fatalf("hessian2 body: rest %q, err %v", rest, err)
			}
			return s
		}},
		{6, func(t *testing.T, b []byte) string {
			var s string
			if err := json.Unmarshal(b, &s); err != nil {
				t.Fatalf("JSON body %q: %v", b, err)
			}
			return s
		}},
		{23, func(_ *testing.T, b []byte) string { return string(b) }}, // fastjson2 writes JSONB
	} {
		frame := protocol.AppendForeignError(nil, 77, tt.id, protocol.StatusBadRequest, msg)
		var h protocol.Header
		copy(h[:], frame)
		if h.Magic() != protocol.Magic || h.ID() != 77 || h.Status() != protocol.StatusBadRequest ||
			h.Flags().IsRequest() || h.Flags().Serialization() != tt.id || int(h.BodyLen()) != len(frame)-protocol.HeaderLen {
			t.Fatalf("id %d: header % x does not answer request 77 with 40 in its serialization", tt.id, h[:])
		}
		if got := tt.body(t, frame[protocol.HeaderLen:]); got != msg {
			t.Errorf("id %d: body says %q, want %q", tt.id, got, msg)
		}
	}
}

// TestReaderRefusesUnknownSerialization: a frame in a serialization the
// reader refuses is skipped whole, its body unparsed: the error names the
// serialization and matches ErrUnknownSerialization and ErrMalformed, and
// the next frame reads as usual. Events are never refused.
func TestReaderRefusesUnknownSerialization(t *testing.T) {
	// A Dubbo hessian2 request's body starts with the Dubbo version.
	foreign := &protocol.Message{Header: request(5)}
	foreign.Header.SetFlags(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, protocol.Hessian2))
	raw := protocol.AppendMessage(nil, foreign)
	body := protocol.AppendHessianString(nil, "2.0.2")
	raw = append(raw[:protocol.HeaderLen], body...)
	var h protocol.Header
	copy(h[:], raw)
	h.SetBodyLen(uint32(len(body)))
	copy(raw, h[:])
	next := &protocol.Message{Header: request(6), Service: "s", Method: "m", Payload: []byte("p")}
	stream := append(append(raw, protocol.AppendHeartbeat(nil, 9)...), encode(next)...)

	rd := protocol.NewReader(reader(stream), 0)
	rd.SetSerializations(func(id byte) bool { return id == next.Header.Flags().Serialization() })
	var m protocol.Message
	err := rd.Read(&m)
	if !errors.Is(err, protocol.ErrUnknownSerialization) || !errors.Is(err, protocol.ErrMalformed) ||
		!strings.Contains(err.Error(), "hessian2 (id 2)") {
		t.Fatalf("foreign frame: err = %v, want ErrUnknownSerialization naming hessian2 (id 2)", err)
	}
	if m.Header.ID() != 5 || m.Service != "" {
		t.Fatalf("foreign frame: header id %d, service %q; want id 5 and the body unparsed", m.Header.ID(), m.Service)
	}
	if err := rd.Read(&m); err != nil || !m.IsHeartbeat() {
		t.Fatalf("the heartbeat (hessian2, an event) after it: err %v, heartbeat %v", err, m.IsHeartbeat())
	}
	if err := rd.Read(&m); err != nil || m.Header.ID() != 6 || m.Service != "s" || string(m.Payload) != "p" {
		t.Fatalf("the dabb frame after it: err %v, %+v", err, m)
	}
}

// TestReaderRefusesTruncatedForeignFrame: a refused frame whose body ends
// early fails the read with io.ErrUnexpectedEOF, as any truncated frame.
func TestReaderRefusesTruncatedForeignFrame(t *testing.T) {
	var h protocol.Header
	h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, protocol.Hessian2), 0, 5)
	h.SetBodyLen(100)
	stream := append(h[:], protocol.AppendHessianString(nil, "2.0.2")...)
	rd := protocol.NewReader(reader(stream), 0)
	rd.SetSerializations(func(id byte) bool { return id == 22 })
	var m protocol.Message
	if err := rd.Read(&m); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a truncated foreign frame: err = %v, want io.ErrUnexpectedEOF", err)
	}
}
