package protocol_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"strings"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

// dubboFrames parses testdata/dubbo-events.hex: a comment line
// "# name: description" names the hex line after it; hex bytes may be
// grouped and separated by spaces.
func dubboFrames(t *testing.T) map[string][]byte {
	t.Helper()
	f, err := os.Open("testdata/dubbo-events.hex")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	frames := map[string][]byte{}
	name := ""
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		switch {
		case text == "":
		case strings.HasPrefix(text, "#"):
			name = ""
			if n, _, ok := strings.Cut(strings.TrimSpace(text[1:]), ":"); ok && !strings.Contains(n, " ") {
				name = n
			}
		default:
			b, err := hex.DecodeString(strings.ReplaceAll(text, " ", ""))
			if err != nil {
				t.Fatalf("dubbo-events.hex:%d: %v", line, err)
			}
			if name == "" {
				t.Fatalf("dubbo-events.hex:%d: hex line without a name comment before it", line)
			}
			frames[name] = b
			name = ""
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return frames
}

func TestEventsMatchDubbo(t *testing.T) {
	frames := dubboFrames(t)
	tests := []struct {
		name            string
		got             []byte
		heartbeat, resp bool
		readOnly        bool
		id              uint64
	}{
		{name: "hb-req", got: protocol.AppendHeartbeat(nil, 1), heartbeat: true, id: 1},
		{name: "hb-resp", got: protocol.AppendHeartbeatResponse(nil, 1), resp: true, id: 1},
		{name: "readonly", got: protocol.AppendReadOnly(nil, 7), readOnly: true, id: 7},
	}
	if len(frames) != len(tests) {
		t.Errorf("dubbo-events.hex holds %d frames, the test knows %d", len(frames), len(tests))
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, ok := frames[tt.name]
			if !ok {
				t.Fatalf("no frame %q in dubbo-events.hex", tt.name)
			}
			if string(tt.got) != string(want) {
				t.Errorf("encoded % x\nwant    % x", tt.got, want)
			}
			var m protocol.Message
			mustRead(t, reader(want), &m)
			if m.IsHeartbeat() != tt.heartbeat || m.IsHeartbeatResponse() != tt.resp || m.IsReadOnly() != tt.readOnly {
				t.Errorf("IsHeartbeat %v, IsHeartbeatResponse %v, IsReadOnly %v; want %v, %v, %v",
					m.IsHeartbeat(), m.IsHeartbeatResponse(), m.IsReadOnly(), tt.heartbeat, tt.resp, tt.readOnly)
			}
			if m.Header.ID() != tt.id || !m.Header.Flags().IsEvent() || m.Header.Flags().Serialization() != protocol.Hessian2 {
				t.Errorf("header % x", m.Header[:])
			}
			if m.Service != "" || m.Method != "" || m.Attachments != nil || string(m.Payload) != string(want[protocol.HeaderLen:]) {
				t.Errorf("event body not kept whole in Payload: %+v", m)
			}
			if err := m.Err(); err != nil {
				t.Errorf("Err() = %v on an event", err)
			}
		})
	}
}

func TestEventRecognition(t *testing.T) {
	event := func(flags protocol.Flags, s protocol.Status, body string) []byte {
		var h protocol.Header
		h.Init(flags, s, 3)
		h.SetBodyLen(uint32(len(body)))
		return append(h[:], body...)
	}
	tests := []struct {
		name                              string
		frame                             []byte
		heartbeat, resp, readOnly, cancel bool
		goAway                            bool
	}{
		// dubbo-go answers a heartbeat with two hessian2 nulls.
		{name: "dubbo-go heartbeat response", frame: event(0x22, protocol.StatusOK, "\x4e\x4e"), resp: true},
		{name: "heartbeat response without body", frame: event(0x22, protocol.StatusOK, ""), resp: true},
		{name: "heartbeat with another serialization id", frame: event(0xf6, 0, "\x4e"), heartbeat: true},
		{name: "heartbeat body ignored", frame: event(0xe2, 0, "\x01R"), heartbeat: true},
		{name: "one-way event with another body", frame: event(0xa2, 0, "\x4e")},
		{name: "read-only under protobuf id", frame: event(0xb6, 0, "\x01R"), readOnly: true},
		{name: "request with read-only body is no event", frame: encode(&protocol.Message{Header: request(3), Payload: []byte("\x01R")})},
		{name: "cancel", frame: event(0xa2, 0, "\x01C"), cancel: true},
		{name: "cancel under protobuf id", frame: event(0xb6, 0, "\x01C"), cancel: true},
		// A two-way event is a heartbeat whatever its body, as in Dubbo.
		{name: "two-way event with cancel body is a heartbeat", frame: event(0xe2, 0, "\x01C"), heartbeat: true},
		{name: "response with cancel body is a heartbeat response", frame: event(0x22, protocol.StatusOK, "\x01C"), resp: true},
		{name: "cancel body with a trailing byte", frame: event(0xa2, 0, "\x01C\x00")},
		{name: "lower-case c", frame: event(0xa2, 0, "\x01c")},
		{name: "request with cancel body is no event", frame: encode(&protocol.Message{Header: request(3), Payload: []byte("\x01C")})},
		{name: "go-away", frame: event(0xa2, 0, "\x01G"), goAway: true},
		{name: "two-way event with go-away body is a heartbeat", frame: event(0xe2, 0, "\x01G"), heartbeat: true},
		{name: "request with go-away body is no event", frame: encode(&protocol.Message{Header: request(3), Payload: []byte("\x01G")})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m protocol.Message
			mustRead(t, reader(tt.frame), &m)
			if m.IsHeartbeat() != tt.heartbeat || m.IsHeartbeatResponse() != tt.resp || m.IsReadOnly() != tt.readOnly || m.IsCancel() != tt.cancel || m.IsGoAway() != tt.goAway {
				t.Errorf("IsHeartbeat %v, IsHeartbeatResponse %v, IsReadOnly %v, IsCancel %v, IsGoAway %v; want %v, %v, %v, %v, %v",
					m.IsHeartbeat(), m.IsHeartbeatResponse(), m.IsReadOnly(), m.IsCancel(), m.IsGoAway(),
					tt.heartbeat, tt.resp, tt.readOnly, tt.cancel, tt.goAway)
			}
		})
	}
}

func TestGoAwayEvent(t *testing.T) {
	got := protocol.AppendGoAway(nil, 9)
	want := []byte{
		0xda, 0xbb, // magic
		0xa2,                   // request | event | hessian2; not two-way
		0x00,                   // status: 0 in a request
		0, 0, 0, 0, 0, 0, 0, 9, // the event's own id
		0x00, 0x00, 0x00, 0x02, // body length 2
		0x01, 0x47, // hessian2 string "G"
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendGoAway\n got % x\nwant % x", got, want)
	}
	var m protocol.Message
	mustRead(t, reader(got), &m)
	if !m.IsGoAway() || m.IsCancel() || m.IsReadOnly() || m.IsHeartbeat() || m.IsHeartbeatResponse() {
		t.Errorf("IsGoAway %v, IsCancel %v, IsReadOnly %v, IsHeartbeat %v, IsHeartbeatResponse %v; want only IsGoAway",
			m.IsGoAway(), m.IsCancel(), m.IsReadOnly(), m.IsHeartbeat(), m.IsHeartbeatResponse())
	}
	for name, frame := range map[string][]byte{
		"heartbeat": protocol.AppendHeartbeat(nil, 1),
		"read-only": protocol.AppendReadOnly(nil, 1),
		"cancel":    protocol.AppendCancel(nil, 1),
	} {
		var m protocol.Message
		mustRead(t, reader(frame), &m)
		if m.IsGoAway() {
			t.Errorf("%s: IsGoAway() = true", name)
		}
	}
}

func TestCancelEvent(t *testing.T) {
	got := protocol.AppendCancel(nil, 0x0102030405060708)
	want := []byte{
		0xda, 0xbb, // magic
		0xa2,                                           // request | event | hessian2; not two-way
		0x00,                                           // status: 0 in a request
		0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // the abandoned call's id
		0x00, 0x00, 0x00, 0x02, // body length 2
		0x01, 0x43, // hessian2 string "C"
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendCancel\n got % x\nwant % x", got, want)
	}
	var m protocol.Message
	mustRead(t, reader(got), &m)
	if !m.IsCancel() || m.IsReadOnly() || m.IsHeartbeat() || m.IsHeartbeatResponse() {
		t.Errorf("IsCancel %v, IsReadOnly %v, IsHeartbeat %v, IsHeartbeatResponse %v; want only IsCancel",
			m.IsCancel(), m.IsReadOnly(), m.IsHeartbeat(), m.IsHeartbeatResponse())
	}
	if m.Header.ID() != 0x0102030405060708 || m.Header.Flags().IsTwoWay() || m.Header.Flags().Serialization() != protocol.Hessian2 {
		t.Errorf("header % x", m.Header[:])
	}
	if err := m.Err(); err != nil {
		t.Errorf("Err() = %v on a cancel event", err)
	}
	// Encoding the decoded frame gives the same bytes.
	if again := protocol.AppendMessage(nil, &m); !bytes.Equal(again, got) {
		t.Errorf("re-encoded % x, want % x", again, got)
	}

	// The other events are not cancels.
	for name, frame := range map[string][]byte{
		"heartbeat":          protocol.AppendHeartbeat(nil, 1),
		"heartbeat response": protocol.AppendHeartbeatResponse(nil, 1),
		"read-only":          protocol.AppendReadOnly(nil, 1),
	} {
		var m protocol.Message
		mustRead(t, reader(frame), &m)
		if m.IsCancel() {
			t.Errorf("%s: IsCancel() = true", name)
		}
	}

	// Appending keeps what dst held.
	two := protocol.AppendCancel(protocol.AppendCancel([]byte("x"), 1), 2)
	if string(two[:1]) != "x" || len(two) != 1+2*(protocol.HeaderLen+2) {
		t.Errorf("AppendCancel did not append: % x", two)
	}
}

// TestCancelEventDoc checks the cancel frame shown in docs/protocol.md,
// marked "<!-- event:cancel -->" (the hex blocks doc_test.go knows are
// Dubbo's frames and the request examples).
func TestCancelEventDoc(t *testing.T) {
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(doc), "<!-- event:cancel -->")
	if !ok {
		t.Fatal("docs/protocol.md has no <!-- event:cancel --> block")
	}
	lines := strings.Split(rest, "\n")
	var got []byte
	in := false
	for i, line := range lines {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "```") {
			if in {
				break
			}
			in = true
			continue
		}
		if !in {
			if line != "" {
				t.Fatalf("the cancel marker is followed by %q, not a fenced block", line)
			}
			continue
		}
		text, _, _ := strings.Cut(line, "#")
		b, err := hex.DecodeString(strings.Join(strings.Fields(text), ""))
		if err != nil {
			t.Fatalf("cancel block line %d: %v", i, err)
		}
		got = append(got, b...)
	}
	if want := protocol.AppendCancel(nil, 5); !bytes.Equal(got, want) {
		t.Errorf("docs/protocol.md shows\n% x\nAppendCancel(nil, 5) writes\n% x", got, want)
	}
}

func TestEventsAppend(t *testing.T) {
	dst := []byte("prefix")
	got := protocol.AppendHeartbeat(dst, 9)
	if string(got[:6]) != "prefix" || len(got) != 6+protocol.HeaderLen+1 {
		t.Errorf("AppendHeartbeat did not append one frame: % x", got)
	}
}
