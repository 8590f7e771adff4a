package protocol_test

import (
	"bufio"
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
		name                      string
		frame                     []byte
		heartbeat, resp, readOnly bool
	}{
		// dubbo-go answers a heartbeat with two hessian2 nulls.
		{name: "dubbo-go heartbeat response", frame: event(0x22, protocol.StatusOK, "\x4e\x4e"), resp: true},
		{name: "heartbeat response without body", frame: event(0x22, protocol.StatusOK, ""), resp: true},
		{name: "heartbeat with another serialization id", frame: event(0xf6, 0, "\x4e"), heartbeat: true},
		{name: "heartbeat body ignored", frame: event(0xe2, 0, "\x01R"), heartbeat: true},
		{name: "one-way event with another body", frame: event(0xa2, 0, "\x4e")},
		{name: "read-only under protobuf id", frame: event(0xb6, 0, "\x01R"), readOnly: true},
		{name: "request with read-only body is no event", frame: encode(&protocol.Message{Header: request(3), Payload: []byte("\x01R")})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var m protocol.Message
			mustRead(t, reader(tt.frame), &m)
			if m.IsHeartbeat() != tt.heartbeat || m.IsHeartbeatResponse() != tt.resp || m.IsReadOnly() != tt.readOnly {
				t.Errorf("IsHeartbeat %v, IsHeartbeatResponse %v, IsReadOnly %v; want %v, %v, %v",
					m.IsHeartbeat(), m.IsHeartbeatResponse(), m.IsReadOnly(), tt.heartbeat, tt.resp, tt.readOnly)
			}
		})
	}
}

func TestEventsAppend(t *testing.T) {
	dst := []byte("prefix")
	got := protocol.AppendHeartbeat(dst, 9)
	if string(got[:6]) != "prefix" || len(got) != 6+protocol.HeaderLen+1 {
		t.Errorf("AppendHeartbeat did not append one frame: % x", got)
	}
}
