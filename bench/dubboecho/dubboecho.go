// Package dubboecho is the benchmark workload as a Dubbo service in
// hessian2: the Java interface com.example.bench.EchoService, whose one
// method echoes com.example.bench.BenchmarkMessage, a POJO with the
// fields of benchpb.BenchmarkMessage, and the typed client and server
// glue rpcgen writes into echoservice_dabb.go.
//
//	dubboecho.RegisterEchoServiceDubboServer(srv, dubboecho.Server{}) // server
//	stub, err := dubboecho.NewEchoServiceDubboClient(client)          // client
//	reply, err := stub.Echo(ctx, dubboecho.FromProto(req))
//
// The dubbo-go program of the bench (bench/dubbogo) declares the same
// class and interface on its side.
package dubboecho

import (
	"context"

	"github.com/dabbrpc/dabb/dubbo"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

//go:generate go run github.com/dabbrpc/dabb/cmd/rpcgen -type EchoService

// Class is the Java class of BenchmarkMessage.
const Class = "com.example.bench.BenchmarkMessage"

// EchoService is com.example.bench.EchoService.
//
//dabb:dubbo com.example.bench.EchoService
type EchoService interface {
	// Echo is BenchmarkMessage echo(BenchmarkMessage req): field1 = "OK",
	// field2 = 100 and every other field echoed. It is idempotent, as an
	// echo is, so calls carry no idempotency key, as dubbo-go's calls
	// carry none; the timeout is long so that a loaded machine measures
	// latency instead of failing calls.
	//dabb:idempotent
	//dabb:timeout 30s
	Echo(ctx context.Context, req *BenchmarkMessage) (*BenchmarkMessage, error)
}

// BenchmarkMessage is com.example.bench.BenchmarkMessage: the fields of
// benchpb.BenchmarkMessage, each the Java field of the same name with a
// lower-case first letter (field1 … field131, padding). Java's types are
// String for string, int for int32, long for int64, boolean for bool,
// long[] for field5 and byte[] for padding.
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

func init() {
	if err := dubbo.RegisterPOJO(Class, BenchmarkMessage{}); err != nil {
		panic(err) // constant arguments: a failure is a bug of this file
	}
}

// Server implements EchoService: it answers the request in place and
// returns it.
type Server struct{}

// Echo implements EchoService.
func (Server) Echo(_ context.Context, req *BenchmarkMessage) (*BenchmarkMessage, error) {
	req.Field1 = "OK"
	req.Field2 = 100
	return req, nil
}

// FromProto returns a BenchmarkMessage with m's fields, strings and
// slices shared.
func FromProto(m *benchpb.BenchmarkMessage) *BenchmarkMessage {
	return &BenchmarkMessage{
		Field1: m.Field1, Field9: m.Field9, Field18: m.Field18, Field80: m.Field80, Field81: m.Field81,
		Field2: m.Field2, Field3: m.Field3, Field280: m.Field280, Field6: m.Field6, Field22: m.Field22,
		Field4: m.Field4, Field5: toInt64s(m.Field5), Field59: m.Field59, Field7: m.Field7, Field16: m.Field16,
		Field130: m.Field130, Field12: m.Field12, Field17: m.Field17, Field13: m.Field13, Field14: m.Field14,
		Field104: m.Field104, Field100: m.Field100, Field101: m.Field101, Field102: m.Field102, Field103: m.Field103,
		Field29: m.Field29, Field30: m.Field30, Field60: m.Field60, Field271: m.Field271, Field272: m.Field272,
		Field150: m.Field150, Field23: m.Field23, Field24: m.Field24, Field25: m.Field25, Field78: m.Field78,
		Field67: m.Field67, Field68: m.Field68, Field128: m.Field128, Field129: m.Field129, Field131: m.Field131,
		Padding: m.Padding,
	}
}

// Proto returns a benchpb.BenchmarkMessage with p's fields, strings and
// slices shared.
func (p *BenchmarkMessage) Proto() *benchpb.BenchmarkMessage {
	return &benchpb.BenchmarkMessage{
		Field1: p.Field1, Field9: p.Field9, Field18: p.Field18, Field80: p.Field80, Field81: p.Field81,
		Field2: p.Field2, Field3: p.Field3, Field280: p.Field280, Field6: p.Field6, Field22: p.Field22,
		Field4: p.Field4, Field5: toUint64s(p.Field5), Field59: p.Field59, Field7: p.Field7, Field16: p.Field16,
		Field130: p.Field130, Field12: p.Field12, Field17: p.Field17, Field13: p.Field13, Field14: p.Field14,
		Field104: p.Field104, Field100: p.Field100, Field101: p.Field101, Field102: p.Field102, Field103: p.Field103,
		Field29: p.Field29, Field30: p.Field30, Field60: p.Field60, Field271: p.Field271, Field272: p.Field272,
		Field150: p.Field150, Field23: p.Field23, Field24: p.Field24, Field25: p.Field25, Field78: p.Field78,
		Field67: p.Field67, Field68: p.Field68, Field128: p.Field128, Field129: p.Field129, Field131: p.Field131,
		Padding: p.Padding,
	}
}

// toInt64s converts field5's fixed64 values to Java's long, bit for bit;
// nil stays nil, as in the standard message.
func toInt64s(v []uint64) []int64 {
	if v == nil {
		return nil
	}
	out := make([]int64, len(v))
	for i, x := range v {
		out[i] = int64(x)
	}
	return out
}

func toUint64s(v []int64) []uint64 {
	if v == nil {
		return nil
	}
	out := make([]uint64, len(v))
	for i, x := range v {
		out[i] = uint64(x)
	}
	return out
}
