package main

import hessian "github.com/apache/dubbo-go-hessian2"

// Java names of the service and its message, as bench/dubboecho declares
// them on dabb's side.
const (
	echoInterface = "com.example.bench.EchoService"
	messageClass  = "com.example.bench.BenchmarkMessage"
)

// BenchmarkMessage is com.example.bench.BenchmarkMessage: the fields of
// the bench's protobuf message (bench/proto/bench.proto), each the Java
// field of the same name with a lower-case first letter. Java's types
// are String for string, int for int32, long for int64, boolean for
// bool, long[] for field5 and byte[] for padding.
type BenchmarkMessage struct {
	Field1   string
	Field9   string
	Field18  string
	Field80  bool
	Field81  bool
	Field2   int32
	Field3   int32
	Field280 int32
	Field6   int32
	Field22  int64
	Field4   string
	Field5   []int64
	Field59  bool
	Field7   string
	Field16  int32
	Field130 int32
	Field12  bool
	Field17  bool
	Field13  bool
	Field14  bool
	Field104 int32
	Field100 int32
	Field101 int32
	Field102 string
	Field103 string
	Field29  int32
	Field30  bool
	Field60  int32
	Field271 int32
	Field272 int32
	Field150 int32
	Field23  int32
	Field24  bool
	Field25  int32
	Field78  bool
	Field67  int32
	Field68  int32
	Field128 int32
	Field129 string
	Field131 int32
	Padding  []byte
}

// JavaClassName is the Java class for hessian2.
func (BenchmarkMessage) JavaClassName() string { return messageClass }

func init() { hessian.RegisterPOJO(&BenchmarkMessage{}) }

// text is every string field's value, as the bench fills it: 18 CJK
// characters, 54 bytes of UTF-8.
const text = "基准测试消息字段内容由十八个汉字组成"

// newMessage returns the workload's request, filled as the bench fills
// it (every string text, every integer 100000, every bool true, field5
// empty), with pad bytes of padding.
func newMessage(pad int) *BenchmarkMessage {
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
	if pad > 0 {
		m.Padding = make([]byte, pad)
		for j := range m.Padding {
			m.Padding[j] = byte(j)
		}
	}
	return m
}

// check reports what is wrong with reply as the server's answer to req,
// as the bench's benchpb.Check does: field1 "OK", field2 100, and a
// sample of the echoed fields, padding included, equal.
func check(req, reply *BenchmarkMessage) error {
	switch {
	case reply == nil:
		return errBadReply("nil")
	case reply.Field1 != "OK" || reply.Field2 != 100:
		return errBadReply("field1 %q, field2 %d; want \"OK\", 100", reply.Field1, reply.Field2)
	case reply.Field3 != req.Field3 || reply.Field131 != req.Field131 || reply.Field129 != req.Field129 ||
		reply.Field78 != req.Field78 || reply.Field22 != req.Field22:
		return errBadReply("echoed fields differ")
	case len(reply.Padding) != len(req.Padding):
		return errBadReply("padding of %d bytes, want %d", len(reply.Padding), len(req.Padding))
	}
	return nil
}
