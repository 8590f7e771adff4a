package dubboecho

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"

	benchpb "github.com/dabbrpc/dabb/bench/proto"
)

// TestProtoRoundTrip copies every field of the message into the POJO and
// back: the copy equals the original, field5's fixed64 values included
// bit for bit.
func TestProtoRoundTrip(t *testing.T) {
	m := benchpb.NewMessage(1 << 10)
	m.Field5 = []uint64{0, 1, 1 << 63, ^uint64(0)}
	p := FromProto(m)
	if p.Field5[3] != -1 || p.Field129 != m.Field129 || len(p.Padding) != len(m.Padding) {
		t.Fatalf("FromProto: field5 %v, field129 %q, padding %d bytes", p.Field5, p.Field129, len(p.Padding))
	}
	if back := p.Proto(); !proto.Equal(back, m) {
		t.Fatalf("round trip differs:\n got %v\nwant %v", back, m)
	}
	if back := FromProto(benchpb.NewMessage(0)).Proto(); back.Field5 != nil {
		t.Fatalf("an empty field5 came back as %v, want nil", back.Field5)
	}
}

// TestServer answers as the workload's servers do: field1 "OK", field2
// 100, the rest echoed, which benchpb.Check accepts.
func TestServer(t *testing.T) {
	req := benchpb.NewMessage(0)
	reply, err := Server{}.Echo(context.Background(), FromProto(req))
	if err != nil {
		t.Fatal(err)
	}
	if err := benchpb.Check(req, reply.Proto()); err != nil {
		t.Fatal(err)
	}
}
