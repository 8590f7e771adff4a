package protocol_test

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"os"
	"reflect"
	"strings"
	"testing"
	"time"

	dabbproto "github.com/dabbrpc/dabb/codec/proto"
	"github.com/dabbrpc/dabb/internal/inventory/inventorypb"
	"github.com/dabbrpc/dabb/protocol"
)

// docHex returns the hex blocks of docs/protocol.md by name: a marker line
// "<!-- hex:NAME -->" followed by a fenced block whose lines are hex bytes
// (grouped as the writer likes), each optionally followed by "# comment".
func docHex(t *testing.T) map[string][]byte {
	t.Helper()
	doc, err := os.ReadFile("../docs/protocol.md")
	if err != nil {
		t.Fatal(err)
	}
	blocks := map[string][]byte{}
	sc := bufio.NewScanner(bytes.NewReader(doc))
	name, inBlock, line := "", false, 0
	var cur []byte
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		switch {
		case inBlock && strings.HasPrefix(text, "```"):
			blocks[name], name, inBlock = cur, "", false
		case inBlock:
			text, _, _ = strings.Cut(text, "#")
			b, err := hex.DecodeString(strings.Join(strings.Fields(text), ""))
			if err != nil {
				t.Fatalf("docs/protocol.md:%d: block %q: %v", line, name, err)
			}
			cur = append(cur, b...)
		case strings.HasPrefix(text, "<!-- hex:"):
			name = strings.TrimSuffix(strings.TrimPrefix(text, "<!-- hex:"), " -->")
			if _, dup := blocks[name]; dup {
				t.Fatalf("docs/protocol.md:%d: block %q twice", line, name)
			}
		case name != "" && strings.HasPrefix(text, "```"):
			inBlock, cur = true, nil
		case name != "" && text != "":
			t.Fatalf("docs/protocol.md:%d: marker %q is not followed by a fenced block", line, name)
		}
	}
	if inBlock {
		t.Fatalf("docs/protocol.md: block %q is not closed", name)
	}
	return blocks
}

func TestDocHexDumps(t *testing.T) {
	var c dabbproto.Codec
	marshal := func(v any) []byte {
		b, err := c.Marshal(nil, v)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	var deductReq, deductResp, errResp protocol.Message
	deductReq.Header.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, dabbproto.ID), 0, 1)
	deductReq.Service = "inventory.Inventory"
	deductReq.Method = "Deduct"
	deductReq.Timeout = 1000 * time.Millisecond
	deductReq.Payload = marshal(&inventorypb.DeductRequest{Sku: "sku-42", Count: 2, RequestId: "r-1"})
	deductResp.Header.Init(protocol.MakeFlags(0, dabbproto.ID), protocol.StatusOK, 1)
	deductResp.Payload = marshal(&inventorypb.DeductReply{Remaining: 98})
	errResp.Header.Init(protocol.MakeFlags(0, dabbproto.ID), 0, 2)
	errResp.SetError(&protocol.Error{Status: protocol.StatusServiceNotFound, Code: protocol.CodeUnimplemented,
		Msg: "method inventory.Inventory.Refund not found"}) // dabb.Server's answer

	want := map[string][]byte{
		"deduct-request":     protocol.AppendMessage(nil, &deductReq),
		"deduct-response":    protocol.AppendMessage(nil, &deductResp),
		"error-response":     protocol.AppendMessage(nil, &errResp),
		"heartbeat":          protocol.AppendHeartbeat(nil, 1),
		"heartbeat-response": protocol.AppendHeartbeatResponse(nil, 1),
		"readonly":           protocol.AppendReadOnly(nil, 7),
		"goaway":             protocol.AppendGoAway(nil, 8),
	}
	blocks := docHex(t)
	// A frame with several attachments has no one byte order (they come
	// from a map): its block must decode to the message and be as long.
	var coded protocol.Message
	coded.Header.Init(protocol.MakeFlags(0, dabbproto.ID), 0, 3)
	coded.SetError(protocol.NewError(protocol.StatusServiceNotFound, "payment_not_found", "no payment 7",
		"payment_id=7", "region=eu"))
	t.Run("coded-error-response", func(t *testing.T) {
		got, ok := blocks["coded-error-response"]
		if !ok {
			t.Fatal("docs/protocol.md has no block \"coded-error-response\"")
		}
		w := protocol.AppendMessage(nil, &coded)
		var m protocol.Message
		mustRead(t, reader(got), &m)
		if d := diffMessage(&m, &coded); d != "" || len(got) != len(w) {
			t.Errorf("docs/protocol.md shows\n% x\nthe encoder writes, in some order,\n% x\n%s", got, w, d)
		}
		want := &protocol.Error{Status: protocol.StatusServiceNotFound, Code: "payment_not_found", Msg: "no payment 7",
			Details: []string{"payment_id=7", "region=eu"}, Remote: true}
		if e := m.Err(); !reflect.DeepEqual(e, want) {
			t.Errorf("documented response gives %#v, want %#v", e, want)
		}
	})
	delete(blocks, "coded-error-response")
	for name := range blocks {
		if _, ok := want[name]; !ok {
			t.Errorf("docs/protocol.md has block %q, which this test does not check", name)
		}
	}
	for name, w := range want {
		t.Run(name, func(t *testing.T) {
			got, ok := blocks[name]
			if !ok {
				t.Fatalf("docs/protocol.md has no block %q", name)
			}
			if !bytes.Equal(got, w) {
				t.Errorf("docs/protocol.md shows\n% x\nthe encoder writes\n% x", got, w)
			}
		})
	}

	// The documented request decodes to what the example says.
	var m protocol.Message
	mustRead(t, reader(blocks["deduct-request"]), &m)
	var req inventorypb.DeductRequest
	if err := c.Unmarshal(m.Payload, &req); err != nil {
		t.Fatal(err)
	}
	if m.Timeout != time.Second || req.GetSku() != "sku-42" || req.GetCount() != 2 || req.GetRequestId() != "r-1" {
		t.Errorf("documented request decodes to timeout %v, %v", m.Timeout, &req)
	}
	var reply protocol.Message
	mustRead(t, reader(blocks["error-response"]), &reply)
	if !strings.Contains(reply.Err().Error(), "status 60 (service not found), code unimplemented: method inventory.Inventory.Refund not found") {
		t.Errorf("documented error response gives %v", reply.Err())
	}
}
