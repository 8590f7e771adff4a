package dubbo

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/codec"
	"github.com/dabbrpc/dabb/protocol"
)

// TestRegistered: importing the package registers the format and codec of
// id 2, so a dabb server reads hessian2 frames.
func TestRegistered(t *testing.T) {
	if f := protocol.LookupBodyFormat(Hessian2ID); f == nil || f.Name() != "dubbo-hessian2" {
		t.Errorf("body format of id 2 = %v, want dubbo-hessian2", f)
	}
	c, err := codec.ByName("hessian2")
	if err != nil || c.ID() != Hessian2ID || !codec.Known(Hessian2ID) {
		t.Errorf("codec hessian2 = %v, %v; want id 2, known", c, err)
	}
}

// readFrame reads one frame of b with dabb's reader.
func readFrame(t *testing.T, b []byte) *protocol.Message {
	t.Helper()
	var m protocol.Message
	if err := protocol.NewReader(bufio.NewReader(bytes.NewReader(b)), 1<<20).Read(&m); err != nil {
		t.Fatalf("read: %v", err)
	}
	return &m
}

// TestRequestThroughCore: a request Message written by the core in the
// format is a body Java's order reads, and reading it back gives the same
// Message: service, method, attachments, the budget and the payload for
// the codec.
func TestRequestThroughCore(t *testing.T) {
	payload, err := Codec{}.Marshal(nil, &Args{Values: []any{int64(10086), int32(3)}})
	if err != nil {
		t.Fatal(err)
	}
	m := &protocol.Message{Service: inventory, Method: "deduct", Payload: payload, Timeout: 1500e6,
		Attachments: map[string]string{"version": "1.0", "trace": "t1"}}
	m.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, Hessian2ID), 0, 7)
	frame := protocol.AppendMessage(nil, m)

	r, err := DecodeRequest(frame[protocol.HeaderLen:], Limits{})
	if err != nil {
		t.Fatal(err)
	}
	wantAtt := map[string]any{"path": inventory, "interface": inventory, "version": "1.0", "trace": "t1", "timeout": "1500"}
	if r.DubboVersion != DubboVersion || r.Path != inventory || r.Version != "1.0" || r.Method != "deduct" ||
		r.ParamTypes != "JI" || fmt.Sprint(r.Args) != "[10086 3]" || !maps.Equal(r.Attachments, wantAtt) {
		t.Errorf("Java's order reads %+v", r)
	}

	got := readFrame(t, frame)
	var a Args
	if err := (Codec{}).Unmarshal(got.Payload, &a); err != nil {
		t.Fatal(err)
	}
	wantMeta := map[string]string{"dubbo": DubboVersion, "path": inventory, "interface": inventory, "version": "1.0", "trace": "t1"}
	if got.Service != inventory || got.Method != "deduct" || got.Timeout != 1500e6 ||
		!maps.Equal(got.Attachments, wantMeta) || a.Types != "JI" || fmt.Sprint(a.Values) != "[10086 3]" {
		t.Errorf("read back %s.%s timeout %v attachments %v args %+v", got.Service, got.Method, got.Timeout, got.Attachments, a)
	}
}

// TestResponsesThroughCore: each response a server makes is written as
// Java's provider answers, and read back as dabb's client reads it.
func TestResponsesThroughCore(t *testing.T) {
	value, err := Codec{}.Marshal(nil, &Response{Value: int64(5), Attachments: map[string]any{"dubbo": DubboVersion}})
	if err != nil {
		t.Fatal(err)
	}
	notFound := map[string]string{protocol.AttachErrorCode: protocol.CodeUnimplemented}
	for _, tc := range []struct {
		name       string
		status     protocol.Status
		payload    string
		att        map[string]string
		wireStatus protocol.Status
		want       string // the decoded body
		readStatus protocol.Status
		readText   string
	}{
		{"value", protocol.StatusOK, string(value), nil, protocol.StatusOK, "value 5 map[dubbo:2.0.2]", protocol.StatusOK, ""},
		{"handler's exception", protocol.StatusBadRequest, IllegalArgumentException + ": no", map[string]string{"error-code": "x"},
			protocol.StatusOK, "exception java.lang.IllegalArgumentException: no", protocol.StatusServiceError, IllegalArgumentException + ": no"},
		{"generic exception", protocol.StatusServiceError, GenericException + ": " + RuntimeException + ": boom", nil,
			protocol.StatusOK, "exception " + GenericException + ": " + RuntimeException + ": boom", protocol.StatusServiceError, GenericException + ": " + RuntimeException + ": boom"},
		{"panic", protocol.StatusServiceError, "handler panic (id 1)", nil,
			protocol.StatusOK, "exception " + RuntimeException + ": handler panic (id 1)", protocol.StatusServiceError, RuntimeException + ": handler panic (id 1)"},
		{"unknown service", protocol.StatusServiceNotFound, "service com.x.Y not found", notFound,
			protocol.StatusServiceError, "text Not found exported service: com.x.Y", protocol.StatusServiceNotFound, "Not found exported service: com.x.Y"},
		{"unknown method", protocol.StatusServiceNotFound, "method com.x.Y.m not found", notFound,
			protocol.StatusServiceError, "text No such method m in service com.x.Y", protocol.StatusServiceNotFound, "No such method m in service com.x.Y"},
		{"java's no such method", protocol.StatusServiceError, "java.lang.NoSuchMethodException: Not found method \"m\" in class com.x.Y.", nil,
			protocol.StatusOK, "exception java.lang.NoSuchMethodException: Not found method \"m\" in class com.x.Y.",
			protocol.StatusServiceNotFound, "java.lang.NoSuchMethodException: Not found method \"m\" in class com.x.Y."},
		{"a handler's own text", protocol.StatusServiceError, "no stock for sku 7", nil,
			protocol.StatusOK, "exception " + RuntimeException + ": no stock for sku 7", protocol.StatusServiceError, RuntimeException + ": no stock for sku 7"},
		{"bad request", protocol.StatusBadRequest, "dubbo-hessian2 body: bad", nil,
			protocol.StatusBadRequest, "text dubbo-hessian2 body: bad", protocol.StatusBadRequest, "dubbo-hessian2 body: bad"},
		{"overload", protocol.StatusServerThreadpoolExhausted, "server busy", nil,
			protocol.StatusServerThreadpoolExhausted, "text server busy", protocol.StatusServerThreadpoolExhausted, "server busy"},
		{"timeout", protocol.StatusServerTimeout, "budget spent", nil,
			protocol.StatusServerTimeout, "text budget spent", protocol.StatusServerTimeout, "budget spent"},
	} {
		m := &protocol.Message{Payload: []byte(tc.payload), Attachments: tc.att}
		m.Header.Init(protocol.MakeFlags(0, Hessian2ID), tc.status, 9)
		frame := protocol.AppendMessage(nil, m)
		var h protocol.Header
		copy(h[:], frame)
		body := frame[protocol.HeaderLen:]
		var got string
		if h.Status() == protocol.StatusOK {
			r, err := DecodeResponse(body, Limits{})
			switch {
			case err != nil:
				got = err.Error()
			case r.Exception != nil:
				got = "exception " + r.Exception.Error()
			default:
				got = fmt.Sprintf("value %v %v", r.Value, r.Attachments)
			}
		} else {
			msg, err := DecodeErrorMessage(body, Limits{})
			got = "text " + msg
			if err != nil {
				got = err.Error()
			}
		}
		if h.Status() != tc.wireStatus || got != tc.want {
			t.Errorf("%s: wire status %d %q, want %d %q", tc.name, h.Status(), got, tc.wireStatus, tc.want)
		}
		if n := protocol.BodyLen(m); int(n) != len(body) {
			t.Errorf("%s: BodyLen %d, frame body %d bytes", tc.name, n, len(body))
		}
		read := readFrame(t, frame)
		text := string(read.Payload)
		if tc.readStatus == protocol.StatusOK {
			text = ""
		}
		if read.Header.Status() != tc.readStatus || text != tc.readText {
			t.Errorf("%s: read back as status %d %q, want %d %q", tc.name, read.Header.Status(), text, tc.readStatus, tc.readText)
		}
	}
}

// TestCodecRefuses: the codec decodes only into its own types, and an
// Args payload must hold exactly what its descriptor names.
func TestCodecRefuses(t *testing.T) {
	var n int64
	if err := (Codec{}).Unmarshal(nil, &n); err == nil {
		t.Error("Unmarshal into *int64 succeeded")
	}
	if _, err := (Codec{}).Marshal(nil, &Args{Types: "JI", Values: []any{int64(1)}}); !errors.Is(err, ErrDescriptor) {
		t.Errorf("Marshal of 1 argument for JI = %v, want ErrDescriptor", err)
	}
	two, err := Codec{}.Marshal(nil, &Args{Types: "J", Values: []any{int64(1)}})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"extra value":      append(two, 0x91),
		"missing value":    hessianString("JJ"),
		"wrong type":       append(hessianString("J"), hessianString("x")...),
		"bad descriptor":   hessianString("Q"),
		"not a descriptor": {0x91},
	} {
		var a Args
		if err := (Codec{}).Unmarshal(data, &a); err == nil {
			t.Errorf("%s: Unmarshal = %+v, want an error", name, a)
		}
	}
}

func TestParseException(t *testing.T) {
	for text, want := range map[string]string{
		"java.lang.RuntimeException: a: b":    "java.lang.RuntimeException|a: b||",
		"java.lang.IllegalStateException":     "java.lang.IllegalStateException|||",
		GenericException + ": a.B: c":         GenericException + "|a.B: c|a.B|c",
		GenericException + ": plain":          GenericException + "|" + RuntimeException + ": plain|" + RuntimeException + "|plain",
		"server busy":                         "<nil>",
		"dubbo-hessian2 body: x":              "<nil>",
		"protocol: body too large":            "<nil>",
		"No such method m in service a.b.C":   "<nil>",
		"Not found exported service: a.b.C:1": "<nil>",
	} {
		got := "<nil>"
		if e := parseException(text); e != nil {
			got = e.Class + "|" + e.Message + "|" + e.WrappedClass + "|" + e.WrappedMessage
		}
		if got != want {
			t.Errorf("parseException(%q) = %s, want %s", text, got, want)
		}
	}
}

// TestRequestTimeoutZeroIsNoBudget: a "timeout" attachment of "0" (sent
// by dubbo-go's failover retries) or "" is no budget, not a spent one;
// "1500" is 1.5 s.
func TestRequestTimeoutZeroIsNoBudget(t *testing.T) {
	for _, tt := range []struct {
		timeout any
		want    time.Duration
	}{{"0", 0}, {"", 0}, {"000", 0}, {"1500", 1500 * time.Millisecond}, {int32(2000), 2 * time.Second}} {
		body, err := AppendRequest(nil, &Request{Path: inventory, Method: "stock", Args: []any{int64(10086)},
			Attachments: map[string]any{"path": inventory, "timeout": tt.timeout}})
		if err != nil {
			t.Fatal(err)
		}
		var h protocol.Header
		h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, Hessian2ID), 0, 9)
		h.SetBodyLen(uint32(len(body)))
		m := readFrame(t, append(h[:], body...))
		if m.Timeout != tt.want {
			t.Errorf("timeout %#v: budget %v, want %v", tt.timeout, m.Timeout, tt.want)
		}
		if _, ok := m.Attachments["timeout"]; ok {
			t.Errorf("timeout %#v: left among the attachments %v", tt.timeout, m.Attachments)
		}
	}
}

// The read loop checks a value response and leaves its decoding to the
// codec, which decodes it once into the caller's type: Format.DecodeBody
// of a value allocates a fraction of what decoding it does. With a full
// decode in the read loop, every response would be decoded twice.
func TestDecodeBodyLeavesValueToCodec(t *testing.T) {
	list := make([]any, 200)
	for i := range list {
		list[i] = fmt.Sprintf("item %d of a result list", i)
	}
	body, err := AppendResponse(nil, &Response{Value: list})
	if err != nil {
		t.Fatal(err)
	}
	var m protocol.Message
	m.Header.Init(protocol.MakeFlags(0, Hessian2ID), protocol.StatusOK, 1)
	buf := make([]byte, len(body))
	check := testing.AllocsPerRun(50, func() {
		copy(buf, body)
		if err := (Format{}).DecodeBody(&m, buf); err != nil {
			t.Fatal(err)
		}
	})
	decode := testing.AllocsPerRun(50, func() {
		if _, err := DecodeResponse(body, Limits{}); err != nil {
			t.Fatal(err)
		}
	})
	if check*4 > decode {
		t.Fatalf("Format.DecodeBody of a 200-string result allocates %v times, decoding it %v: "+
			"the read loop decodes values the codec decodes again", check, decode)
	}
	if len(m.Payload) != len(body) {
		t.Fatalf("the payload is %d bytes, want the %d-byte body for the codec", len(m.Payload), len(body))
	}
}

// A small body's decoder reads through a buffer of the body's size, not
// the library's 4 KiB: decoding a short request's arguments allocates far
// less than 4 KiB.
func TestDecodeSmallBodyAllocatesLittle(t *testing.T) {
	payload, err := Codec{}.Marshal(nil, &Args{Types: "JI", Values: []any{int64(10086), int32(2)}})
	if err != nil {
		t.Fatal(err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	const n = 100
	for range n {
		var a Args
		if err := (Codec{}).Unmarshal(payload, &a); err != nil {
			t.Fatal(err)
		}
	}
	runtime.ReadMemStats(&after)
	if per := (after.TotalAlloc - before.TotalAlloc) / n; per >= 4096 {
		t.Fatalf("decoding a %d-byte argument list allocates %d bytes: a decoder with a 4 KiB buffer per value segment", len(payload), per)
	}
}
