package protocol_test

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/dabbrpc/dabb/protocol"
)

// fuzzLimit is the body limit FuzzReadMessage reads with.
const fuzzLimit = 4 << 10

// FuzzReadMessage feeds arbitrary bytes to ReadMessage. It must never
// panic, fail only with the documented errors, and a message it accepts
// must survive AppendMessage and a second read unchanged, within
// MaxAttachments. The seed corpus in testdata/fuzz/FuzzReadMessage holds
// real frames, and frames at and over the attachment limit.
func FuzzReadMessage(f *testing.F) {
	f.Add(encode(typical()))
	f.Add(protocol.AppendHeartbeat(nil, 1))
	toy := typical()
	toy.Header = toyHeader(protocol.FlagRequest|protocol.FlagTwoWay, 0, 1)
	toy.Attachments = map[string]string{"k": "v"}
	f.Add(encode(toy))
	f.Add(encode(&protocol.Message{Header: toyHeader(0, protocol.StatusServiceError, 1), Payload: []byte("no")}))
	f.Fuzz(func(t *testing.T, data []byte) {
		var m protocol.Message
		err := protocol.ReadMessage(reader(data), &m, fuzzLimit)
		if err != nil {
			switch {
			case errors.Is(err, protocol.ErrBadMagic), errors.Is(err, protocol.ErrBodyTooLarge),
				errors.Is(err, protocol.ErrMalformed), err == io.EOF, err == io.ErrUnexpectedEOF:
			default:
				t.Fatalf("undocumented error %T: %v", err, err)
			}
			return
		}
		n := m.Header.BodyLen()
		if n > fuzzLimit || int(n) > len(data)-protocol.HeaderLen {
			t.Fatalf("accepted a body of %d bytes from %d bytes of input, limit %d", n, len(data), fuzzLimit)
		}
		if err := protocol.CheckAttachments(&m); err != nil {
			t.Fatalf("accepted a message a sender may not send: %v", err)
		}

		// A Reader (interning names) reads the same message.
		var viaReader protocol.Message
		if err := protocol.NewReader(reader(data), fuzzLimit).Read(&viaReader); err != nil {
			t.Fatalf("ReadMessage accepted the frame, Reader.Read: %v", err)
		}
		if d := diffMessage(&viaReader, &m); d != "" {
			t.Fatalf("Reader.Read and ReadMessage differ: %s", d)
		}

		again := protocol.AppendMessage(nil, &m)
		if m.Header.Flags().IsEvent() && !bytes.Equal(again, data[:protocol.HeaderLen+int(n)]) {
			t.Fatalf("event re-encoded as % x, read from % x", again, data[:protocol.HeaderLen+int(n)])
		}
		var m2 protocol.Message
		if err := protocol.ReadMessage(reader(again), &m2, 0); err != nil {
			t.Fatalf("re-encoded frame does not read back: %v\nframe % x", err, again)
		}
		if d := diffMessage(&m2, &m); d != "" {
			t.Fatalf("re-encoded frame reads back different: %s", d)
		}
	})
}

// maxWireMillis is the largest timeout ReadMessage accepts: 12 decimal
// digits of milliseconds.
const maxWireMillis = 999_999_999_999

// FuzzBody encodes arbitrary message fields with AppendMessage and checks
// that ReadMessage gives them back, with the timeout normalised as the wire
// carries it: a positive budget rounded up to whole milliseconds, a
// negative one as spent (-1 ns).
func FuzzBody(f *testing.F) {
	f.Add("inventory.Inventory", "Deduct", int64(time.Second), "idempotency-key", "k-1", "traceparent", "00-1-2-01",
		[]byte{0x0a, 0x06, 's', 'k', 'u', '-', '4', '2'}, uint64(1), byte(0xd6), byte(0))
	f.Fuzz(func(t *testing.T, service, method string, timeout int64, k1, v1, k2, v2 string,
		payload []byte, id uint64, flags, status byte) {
		in := protocol.Message{
			Service:     service,
			Method:      method,
			Timeout:     time.Duration(timeout),
			Attachments: map[string]string{k1: v1, k2: v2},
			Payload:     payload,
		}
		in.Header.Init(protocol.Flags(flags), protocol.Status(status), id)

		want := protocol.Message{Header: in.Header, Payload: payload}
		if !in.Header.Flags().IsEvent() {
			if in.Header.Flags().IsRequest() || protocol.PayloadAtEnd(&in) {
				// A body format need not carry a response's names: the
				// toy's does not, nor does Dubbo's.
				want.Service, want.Method = service, method
			}
			want.Attachments = map[string]string{}
			for k, v := range in.Attachments {
				if k != protocol.AttachTimeout {
					want.Attachments[k] = v
				}
			}
			if in.Timeout < 0 {
				want.Timeout = -1
			} else if in.Timeout > 0 {
				ms := in.Timeout / time.Millisecond
				if in.Timeout%time.Millisecond != 0 {
					ms++ // rounded up
				}
				if in.Timeout > maxWireMillis*time.Millisecond {
					ms = maxWireMillis // capped on the wire
				}
				want.Timeout = ms * time.Millisecond
			}
		}

		frame := protocol.AppendMessage(nil, &in)
		var got protocol.Message
		if err := protocol.ReadMessage(reader(frame), &got, 0); err != nil {
			t.Fatalf("ReadMessage: %v\nframe % x", err, frame)
		}
		if d := diffMessage(&got, &want); d != "" {
			t.Fatal(d)
		}
		if got.Header.BodyLen() != uint32(len(frame)-protocol.HeaderLen) {
			t.Fatalf("body length %d, frame body %d", got.Header.BodyLen(), len(frame)-protocol.HeaderLen)
		}
	})
}
