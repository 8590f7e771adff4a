package benchpb

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"
)

// StandardSize is the marshaled size of the standard message, NewMessage(0).
const StandardSize = 581

// text is every string field's value: 18 CJK characters, 54 bytes of UTF-8,
// so string validation does real work as in the reference benchmarks.
const text = "基准测试消息字段内容由十八个汉字组成"

// ErrBadReply reports a reply that is not the server's answer to the
// request.
var ErrBadReply = errors.New("benchpb: bad reply")

// NewMessage returns the workload's request: every string field 54 bytes,
// every integer 100000, every bool true, field5 empty, 581 bytes marshaled.
// With size >= StandardSize+4, padding grows the message to exactly size
// bytes marshaled (a smaller size gives the standard message).
func NewMessage(size int) *BenchmarkMessage {
	const i = 100000
	m := &BenchmarkMessage{
		Field1: text, Field9: text, Field18: text, Field4: text, Field7: text,
		Field102: text, Field103: text, Field129: text,
		Field80: true, Field81: true, Field59: true, Field12: true, Field17: true,
		Field13: true, Field14: true, Field30: true, Field24: true, Field78: true,
		Field2: i, Field3: i, Field280: i, Field6: i, Field22: i, Field16: i,
		Field130: i, Field104: i, Field100: i, Field101: i, Field29: i, Field60: i,
		Field271: i, Field272: i, Field150: i, Field23: i, Field25: i, Field67: i,
		Field68: i, Field128: i, Field131: i,
	}
	if size > StandardSize {
		// The tag of field 500 takes 2 bytes, the length 1 to 4.
		n := size - StandardSize - 2
		for n > 0 && n+sizeVarint(uint64(n)) > size-StandardSize-2 {
			n--
		}
		m.Padding = make([]byte, n)
		for j := range m.Padding {
			m.Padding[j] = byte(j)
		}
	}
	return m
}

func sizeVarint(v uint64) int {
	n := 1
	for v >= 0x80 {
		v >>= 7
		n++
	}
	return n
}

// Answer turns a request into the server's reply in place: field1 = "OK",
// field2 = 100, everything else as it came.
func Answer(m *BenchmarkMessage) {
	m.Field1 = "OK"
	m.Field2 = 100
}

// CopyTo copies every field of src into dst, sharing strings and slices:
// the echo of servers whose reply is a separate value the framework
// allocated.
func CopyTo(dst, src *BenchmarkMessage) {
	dst.Field1, dst.Field9, dst.Field18, dst.Field4, dst.Field7 = src.Field1, src.Field9, src.Field18, src.Field4, src.Field7
	dst.Field102, dst.Field103, dst.Field129 = src.Field102, src.Field103, src.Field129
	dst.Field80, dst.Field81, dst.Field59, dst.Field12, dst.Field17 = src.Field80, src.Field81, src.Field59, src.Field12, src.Field17
	dst.Field13, dst.Field14, dst.Field30, dst.Field24, dst.Field78 = src.Field13, src.Field14, src.Field30, src.Field24, src.Field78
	dst.Field2, dst.Field3, dst.Field280, dst.Field6, dst.Field22 = src.Field2, src.Field3, src.Field280, src.Field6, src.Field22
	dst.Field16, dst.Field130, dst.Field104, dst.Field100, dst.Field101 = src.Field16, src.Field130, src.Field104, src.Field100, src.Field101
	dst.Field29, dst.Field60, dst.Field271, dst.Field272, dst.Field150 = src.Field29, src.Field60, src.Field271, src.Field272, src.Field150
	dst.Field23, dst.Field25, dst.Field67, dst.Field68, dst.Field128, dst.Field131 = src.Field23, src.Field25, src.Field67, src.Field68, src.Field128, src.Field131
	dst.Field5, dst.Padding = src.Field5, src.Padding
}

// Check reports whether reply is the server's answer to req: field1 "OK",
// field2 100, and a sample of the echoed fields, padding included, equal.
func Check(req, reply *BenchmarkMessage) error {
	switch {
	case reply == nil:
		return fmt.Errorf("%w: nil", ErrBadReply)
	case reply.Field1 != "OK" || reply.Field2 != 100:
		return fmt.Errorf("%w: field1 %q, field2 %d; want \"OK\", 100", ErrBadReply, reply.Field1, reply.Field2)
	case reply.Field3 != req.Field3 || reply.Field131 != req.Field131 || reply.Field129 != req.Field129 ||
		reply.Field78 != req.Field78 || reply.Field22 != req.Field22:
		return fmt.Errorf("%w: echoed fields differ", ErrBadReply)
	case len(reply.Padding) != len(req.Padding):
		return fmt.Errorf("%w: padding of %d bytes, want %d", ErrBadReply, len(reply.Padding), len(req.Padding))
	}
	return nil
}

// Size returns m's marshaled size.
func Size(m *BenchmarkMessage) int { return proto.Size(m) }
