package dubbo

import (
	"bufio"
	"bytes"
	"fmt"
	"maps"
	"testing"

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
			protocol.StatusServiceError, "text Not found exported service: com.x.Y", protocol.StatusServiceError, "Not found exported service: com.x.Y"},
		{"unknown method", protocol.StatusServiceNotFound, "method com.x.Y.m not found", notFound,
			protocol.StatusServiceError, "text No such method m in service com.x.Y", protocol.StatusServiceError, "No such method m in service com.x.Y"},
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
