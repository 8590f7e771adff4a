package protocol_test

import (
	"bufio"
	"testing"

	"github.com/dabbrpc/dabb/protocol"
)

var (
	sinkHeader protocol.Header
	sinkU64    uint64
)

func BenchmarkHeaderEncode(b *testing.B) {
	b.ReportAllocs()
	var id uint64
	for b.Loop() {
		id++
		var h protocol.Header
		h.Init(protocol.MakeFlags(protocol.FlagRequest|protocol.FlagTwoWay, 22), 0, id)
		h.SetBodyLen(uint32(id))
		sinkHeader = h
	}
}

func BenchmarkHeaderDecode(b *testing.B) {
	h := request(12345)
	h.SetBodyLen(100)
	b.ReportAllocs()
	for b.Loop() {
		f := h.Flags()
		var x uint64
		if h.Magic() == protocol.Magic && f.IsRequest() && f.IsTwoWay() && !f.IsEvent() {
			x = uint64(f.Serialization())
		}
		sinkU64 += x + uint64(h.Status()) + h.ID() + uint64(h.BodyLen())
	}
}

// BenchmarkAppendMessage encodes a typical request (service, method,
// timeout, 64-byte payload) into a buffer with room.
func BenchmarkAppendMessage(b *testing.B) {
	m := typical()
	buf := make([]byte, 0, 256)
	b.SetBytes(int64(len(encode(m))))
	b.ReportAllocs()
	for b.Loop() {
		buf = protocol.AppendMessage(buf[:0], m)
	}
}

func benchmarkRead(b *testing.B, m *protocol.Message, useReader bool) {
	frame := encode(m)
	br := bufio.NewReader(&loopReader{data: frame})
	r := protocol.NewReader(br, 0)
	var got protocol.Message
	b.SetBytes(int64(len(frame)))
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if useReader {
			err = r.Read(&got)
		} else {
			err = protocol.ReadMessage(br, &got, 0)
		}
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadMessage decodes a steady stream of typical requests with
// ReadMessage, which allocates the service and method strings.
func BenchmarkReadMessage(b *testing.B) { benchmarkRead(b, typical(), false) }

// BenchmarkReaderRead decodes the same stream with a Reader, which interns
// the names: 0 allocs/op.
func BenchmarkReaderRead(b *testing.B) { benchmarkRead(b, typical(), true) }

// BenchmarkReaderReadAttachments adds two attachments: the map and the
// values are allocated per frame.
func BenchmarkReaderReadAttachments(b *testing.B) {
	m := typical()
	m.Attachments = map[string]string{protocol.AttachIdempotencyKey: "0123456789abcdef", "traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}
	benchmarkRead(b, m, true)
}

// BenchmarkReaderReadLarge reads 1 MiB payloads (the chunked path on the
// first read, then the reused buffer).
func BenchmarkReaderReadLarge(b *testing.B) {
	m := typical()
	m.Payload = make([]byte, 1<<20)
	benchmarkRead(b, m, true)
}
